/* SPDX-License-Identifier: MIT */
/* The lifecycle's states, typed: a run record's state, a job's stage and what its owner wants.
 * Each has one string table (the store's and the API's spelling) and the run state one
 * transition function: every change of a run record goes through it, and a change it does not
 * list is refused (logged), never written. docs/platform.md draws the same machine. */
#pragma once

#include <stdbool.h>

/* A run record (runs/<job>): one generation's run, from its claim to its end. */
typedef enum {
    RR_NONE = 0,   /* no record yet (a new job) */
    RR_INSTALLING, /* claimed; a control process is installing it on its node */
    RR_RUNNING,    /* installed and serving */
    RR_PAUSED,     /* stopped with its root kept (a pause, or the first half of a move) */
    RR_FAILED,     /* the install failed; tried again after a backoff (or final) */
    RR_RETIRED,    /* removed from its node (canceled, timed out) */
    RR_EXITED,     /* its command ended */
    RR_LOST,       /* its node went silent past node_dead_ms; kept to retire it later */
    RR_STATE_MAX,
} runrec_state_t;

/* "installing", "running", ...; NULL for a value out of range. */
const char *runrec_state_to_string(runrec_state_t s);
/* The state a string names; -EINVAL for anything else (RR_NONE has no spelling). */
int runrec_state_from_string(const char *s, runrec_state_t *ret);
/* Whether a run record may go from `from` to `to`. A claim (to RR_INSTALLING: a new generation,
 * or a new activation of the same one) is allowed from every state a start may follow; the rest
 * are the steps of one run. */
bool runrec_transition_ok(runrec_state_t from, runrec_state_t to);

/* A job's stage (what the API shows). */
typedef enum {
    STAGE_SCHEDULING,
    STAGE_RUNNING,
    STAGE_PAUSED,
    STAGE_COMPLETED,
    STAGE_CANCELED,
    STAGE_ERROR,
    STAGE_MAX,
} job_stage_t;
const char *job_stage_to_string(job_stage_t s);
int job_stage_from_string(const char *s, job_stage_t *ret);
/* COMPLETED, CANCELED and ERROR: nothing runs any more. */
bool job_stage_ended(job_stage_t s);

/* What the job's owner asked for. */
typedef enum {
    DESIRED_RUNNING,
    DESIRED_PAUSED,
    DESIRED_CANCELED,
    DESIRED_MAX,
} job_desired_t;
const char *job_desired_to_string(job_desired_t d);
int job_desired_from_string(const char *s, job_desired_t *ret);
