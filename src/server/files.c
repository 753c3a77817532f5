/* SPDX-License-Identifier: MIT */
/* /v1/files/... — placeholder until the file API lands. */
#include "routes.h"
#include "server.h"

#define NOT_YET(name)                                                                              \
    void name(conn_t *c, const route_params_t *p)                                                 \
    {                                                                                              \
        (void)p;                                                                                   \
        conn_respond_error(c, 501, "not implemented");                                             \
    }
NOT_YET(route_files_read)
NOT_YET(route_files_write)
NOT_YET(route_files_list)
NOT_YET(route_files_stat)
NOT_YET(route_files_delete)
NOT_YET(route_files_mkdir)
NOT_YET(route_files_rename)
