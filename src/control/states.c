/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>

#include "common/macro.h"
#include "states.h"

static const char *const run_states[RUN_STATE_MAX] = {
    [RUN_INSTALLING] = "installing",
    [RUN_RUNNING] = "running",
    [RUN_PAUSED] = "paused",
    [RUN_FAILED] = "failed",
    [RUN_RETIRED] = "retired",
    [RUN_EXITED] = "exited",
    [RUN_LOST] = "lost",
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

const char *run_state_to_string(run_state_t s)
{
    return (unsigned)s < RUN_STATE_MAX ? run_states[s] : NULL;
}

int run_state_from_string(const char *s, run_state_t *ret)
{
    int i = lookup(run_states, RUN_STATE_MAX, s);
    if (i < 0)
        return i;
    *ret = (run_state_t)i;
    return 0;
}

/* from -> to, one bit per target state. */
#define TO(s) (1u << (s))
static const unsigned transitions[RUN_STATE_MAX] = {
    [RUN_NONE] = TO(RUN_INSTALLING),
    /* installed, or failed (also: its installer is gone), lost with its node, or canceled */
    [RUN_INSTALLING] = TO(RUN_RUNNING) | TO(RUN_FAILED) | TO(RUN_LOST) | TO(RUN_RETIRED),
    [RUN_RUNNING] = TO(RUN_PAUSED) | TO(RUN_EXITED) | TO(RUN_LOST) | TO(RUN_RETIRED),
    /* resumed or moved (a new generation from its root), or canceled */
    [RUN_PAUSED] = TO(RUN_INSTALLING) | TO(RUN_RETIRED),
    /* tried again (a new activation), or canceled */
    [RUN_FAILED] = TO(RUN_INSTALLING) | TO(RUN_RETIRED),
    [RUN_EXITED] = TO(RUN_RETIRED),
    /* restarted elsewhere (on_node_loss: restart), or canceled */
    [RUN_LOST] = TO(RUN_INSTALLING) | TO(RUN_RETIRED),
    /* started over as a first generation (a job whose record was retired) */
    [RUN_RETIRED] = TO(RUN_INSTALLING),
};

bool run_state_transition_ok(run_state_t from, run_state_t to)
{
    if ((unsigned)from >= RUN_STATE_MAX || (unsigned)to >= RUN_STATE_MAX)
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
