/* SPDX-License-Identifier: MIT */
#include "runjson.h"

#include <errno.h>
#include <string.h>

json_t *cap_run_to_json(const cap_run_t *id)
{
    return json_pack("{s:s,s:I,s:s,s:s,s:s,s:s}", "sandbox", id->sandbox, "generation",
                     (json_int_t)id->generation, "node", id->node, "substrate", id->substrate,
                     "activation", id->activation, "instance", id->instance);
}

int cap_run_from_json(json_t *j, cap_run_t *ret)
{
    const char *sb, *node, *sub, *act, *inst;
    json_int_t gen;
    if (json_unpack(j, "{s:s,s:I,s:s,s:s,s:s,s:s}", "sandbox", &sb, "generation", &gen, "node",
                    &node, "substrate", &sub, "activation", &act, "instance", &inst) < 0)
        return -EINVAL;
    if (gen < 1 || !cap_id_valid(sb) || !cap_id_valid(node) || !cap_id_valid(sub) ||
        !cap_id_valid(act) || !cap_id_valid(inst))
        return -EINVAL;
    cap_run_t id = { .generation = (uint64_t)gen };
    memcpy(id.sandbox, sb, strlen(sb) + 1); /* cap_id_valid: < CAP_ID_MAX bytes */
    memcpy(id.node, node, strlen(node) + 1);
    memcpy(id.substrate, sub, strlen(sub) + 1);
    memcpy(id.activation, act, strlen(act) + 1);
    memcpy(id.instance, inst, strlen(inst) + 1);
    *ret = id;
    return 0;
}
