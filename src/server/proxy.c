/* SPDX-License-Identifier: MIT */
/* /v1/proxy/{port}/... — placeholder until the port proxy lands. */
#include "routes.h"
#include "server.h"

void route_proxy(conn_t *c, const route_params_t *p)
{
    (void)p;
    conn_respond_error(c, 501, "not implemented");
}
