/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>

#include "common/macro.h"
#include "states.h"

static const char *const run_states[RR_STATE_MAX] = {
    [RR_INSTALLING] = "installing",
    [RR_RUNNING] = "running",
    [RR_PAUSED] = "paused",
    [RR_FAILED] = "failed",
    [RR_RETIRED] = "retired",
    [RR_EXITED] = "exited",
    [RR_LOST] = "lost",
};

static const char *const stages[STAGE_MAX] = {
    [STAGE_SCHEDULING] = "SCHEDULING", [STAGE_RUNNING] = "RUNNING",   [STAGE_PAUSED] = "PAUSED",
    [STAGE_COMPLETED] = "COMPLETED",   [STAGE_CANCELED] = "CANCELED", [STAGE_ERROR] = "ERROR",
};

static const char *const desires[DESIRED_MAX] = {
    [DESIRED_RUNNING] = "running",
    [DESIRED_PAUSED] = "paused",
    [DESIRED_CANCELED] = "canceled",
};

static int lookup(const char *const *table, int n, const char *s)
{
    if (!s)
        return -EINVAL;
    for (int i = 0; i < n; i++)
        if (table[i] && strcmp(table[i], s) == 0)
            return i;
    return -EINVAL;
}

const char *runrec_state_to_string(runrec_state_t s)
{
    return (unsigned)s < RR_STATE_MAX ? run_states[s] : NULL;
}

int runrec_state_from_string(const char *s, runrec_state_t *ret)
{
    int i = lookup(run_states, RR_STATE_MAX, s);
    if (i < 0)
        return i;
    *ret = (runrec_state_t)i;
    return 0;
}

/* from -> to, one bit per target state. */
#define TO(s) (1u << (s))
static const unsigned transitions[RR_STATE_MAX] = {
    [RR_NONE] = TO(RR_INSTALLING),
    /* installed, or failed (also: its installer is gone), lost with its node, or canceled */
    [RR_INSTALLING] = TO(RR_RUNNING) | TO(RR_FAILED) | TO(RR_LOST) | TO(RR_RETIRED),
    [RR_RUNNING] = TO(RR_PAUSED) | TO(RR_EXITED) | TO(RR_LOST) | TO(RR_RETIRED),
    /* resumed or moved (a new generation from its root), or canceled */
    [RR_PAUSED] = TO(RR_INSTALLING) | TO(RR_RETIRED),
    /* tried again (a new activation), or canceled */
    [RR_FAILED] = TO(RR_INSTALLING) | TO(RR_RETIRED),
    [RR_EXITED] = TO(RR_RETIRED),
    /* restarted elsewhere (on_node_loss: restart), or canceled */
    [RR_LOST] = TO(RR_INSTALLING) | TO(RR_RETIRED),
    /* started over as a first generation (a job whose record was retired) */
    [RR_RETIRED] = TO(RR_INSTALLING),
};

bool runrec_transition_ok(runrec_state_t from, runrec_state_t to)
{
    if ((unsigned)from >= RR_STATE_MAX || (unsigned)to >= RR_STATE_MAX)
        return false;
    return transitions[from] & TO(to);
}

const char *job_stage_to_string(job_stage_t s)
{
    return (unsigned)s < STAGE_MAX ? stages[s] : NULL;
}

int job_stage_from_string(const char *s, job_stage_t *ret)
{
    int i = lookup(stages, STAGE_MAX, s);
    if (i < 0)
        return i;
    *ret = (job_stage_t)i;
    return 0;
}

bool job_stage_ended(job_stage_t s)
{
    return s == STAGE_COMPLETED || s == STAGE_CANCELED || s == STAGE_ERROR;
}

const char *job_desired_to_string(job_desired_t d)
{
    return (unsigned)d < DESIRED_MAX ? desires[d] : NULL;
}

int job_desired_from_string(const char *s, job_desired_t *ret)
{
    int i = lookup(desires, DESIRED_MAX, s);
    if (i < 0)
        return i;
    *ret = (job_desired_t)i;
    return 0;
}
