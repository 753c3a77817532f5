/* SPDX-License-Identifier: MIT */
/* The lifecycle's typed states (src/control/states.c): each string table round-trips and
 * refuses anything else, and the run record's transition table allows exactly the steps of
 * docs/platform.md's lifecycle. */
#include <errno.h>
#include <string.h>

#include "control/states.h"
#include "tap.h"

TEST(run_states_round_trip)
{
    for (int s = RR_INSTALLING; s < RR_STATE_MAX; s++) {
        const char *name = runrec_state_to_string((runrec_state_t)s);
        ASSERT_TRUE(name != NULL);
        runrec_state_t back = RR_NONE;
        ASSERT_EQ(runrec_state_from_string(name, &back), 0);
        ASSERT_EQ((int)back, s);
    }
    runrec_state_t x = RR_RUNNING;
    ASSERT_EQ(runrec_state_from_string("Running", &x), -EINVAL);
    ASSERT_EQ(runrec_state_from_string("", &x), -EINVAL);
    ASSERT_EQ(runrec_state_from_string(NULL, &x), -EINVAL);
    ASSERT_EQ((int)x, RR_RUNNING); /* untouched on failure */
    ASSERT_TRUE(runrec_state_to_string(RR_NONE) == NULL);
    ASSERT_TRUE(runrec_state_to_string(RR_STATE_MAX) == NULL);
}

TEST(stages_and_desires_round_trip)
{
    static const char *const stages[] = { "SCHEDULING", "RUNNING",  "PAUSED",
                                          "COMPLETED",  "CANCELED", "ERROR" };
    for (int i = 0; i < STAGE_MAX; i++) {
        job_stage_t s;
        ASSERT_EQ(job_stage_from_string(stages[i], &s), 0);
        ASSERT_STREQ(job_stage_to_string(s), stages[i]);
        ASSERT_EQ(job_stage_ended(s), i >= STAGE_COMPLETED);
    }
    static const char *const desires[] = { "running", "paused", "canceled" };
    for (int i = 0; i < DESIRED_MAX; i++) {
        job_desired_t d;
        ASSERT_EQ(job_desired_from_string(desires[i], &d), 0);
        ASSERT_STREQ(job_desired_to_string(d), desires[i]);
    }
    job_stage_t s;
    job_desired_t d;
    ASSERT_EQ(job_stage_from_string("running", &s), -EINVAL);
    ASSERT_EQ(job_desired_from_string("RUNNING", &d), -EINVAL);
}

TEST(run_transitions_are_exactly_the_lifecycle)
{
    /* allowed[from] lists the states a record may go to; every other pair is refused */
    static const char *const allowed[RR_STATE_MAX] = {
        [RR_NONE] = "installing",
        [RR_INSTALLING] = "running failed lost retired",
        [RR_RUNNING] = "paused exited lost retired",
        [RR_PAUSED] = "installing retired",
        [RR_FAILED] = "installing retired",
        [RR_RETIRED] = "installing",
        [RR_EXITED] = "retired",
        [RR_LOST] = "installing retired",
    };
    for (int from = 0; from < RR_STATE_MAX; from++)
        for (int to = 0; to < RR_STATE_MAX; to++) {
            const char *name = runrec_state_to_string((runrec_state_t)to);
            bool want = false;
            if (name) {
                const char *p = strstr(allowed[from], name);
                size_t n = strlen(name);
                want = p && (p == allowed[from] || p[-1] == ' ') && (p[n] == ' ' || !p[n]);
            }
            bool got = runrec_transition_ok((runrec_state_t)from, (runrec_state_t)to);
            ASSERT_EQ(got, want);
        }
    ASSERT_FALSE(runrec_transition_ok(RR_STATE_MAX, RR_RUNNING));
    ASSERT_FALSE(runrec_transition_ok(RR_RUNNING, RR_STATE_MAX));
}

TAP_MAIN(T(run_states_round_trip), T(stages_and_desires_round_trip),
         T(run_transitions_are_exactly_the_lifecycle))
