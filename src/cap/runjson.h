/* SPDX-License-Identifier: MIT */
/* A run identity as JSON ({sandbox, generation, node, substrate, activation, instance}): the
 * one encoding the control plane's run records, the node's run records and the APIs share. */
#pragma once

#include <jansson.h>

#include "cap.h"

json_t *cap_run_to_json(const cap_run_t *id);
/* Strict: every field present, ids valid (cap_id_valid), generation >= 1; else -EINVAL. */
int cap_run_from_json(json_t *j, cap_run_t *ret);
