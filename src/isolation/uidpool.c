/* SPDX-License-Identifier: MIT */
#include "uidpool.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>

#include "common/macro.h"
#include "common/strutil.h"

int uidpool_init(uidpool_t *p, uint32_t base, uint32_t count)
{
    *p = (uidpool_t){ .base = base, .count = count, .lock_fd = -1 };
    p->state = calloc(count, 1);
    p->recycled = calloc(count, sizeof *p->recycled);
    if (!p->state || !p->recycled) {
        uidpool_done(p);
        return -ENOMEM;
    }
    return 0;
}

void uidpool_done(uidpool_t *p)
{
    free(p->state);
    free(p->recycled);
    p->state = NULL;
    p->recycled = NULL;
    p->lock_fd = safe_close(p->lock_fd); /* drops every uid lock of this pool */
}

int uidpool_lock_file(uidpool_t *p, const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return negative_errno();
    safe_close(p->lock_fd);
    p->lock_fd = fd;
    return 0;
}

/* Lock byte <uid> for this pool: 0, or -EAGAIN when another pool holds it. Other errors (no
 * lock file, ENOLCK) leave the uid to this pool alone, as without a lock file. */
static int uid_lock(uidpool_t *p, uint32_t uid, short type)
{
    if (p->lock_fd < 0)
        return 0;
    struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = uid, .l_len = 1 };
    if (fcntl(p->lock_fd, F_OFD_SETLK, &fl) == 0)
        return 0;
    return errno == EAGAIN || errno == EACCES ? -EAGAIN : 0;
}

/* Hand out uid if no other pool holds it; else it is reserved for good. */
static bool claim(uidpool_t *p, uint32_t uid)
{
    uint8_t *s = &p->state[uid - p->base];
    if (uid_lock(p, uid, F_WRLCK) < 0) {
        *s = UID_RESERVED;
        p->n_reserved++;
        return false;
    }
    *s = UID_USED;
    p->n_used++;
    return true;
}

static bool in_range(const uidpool_t *p, uint64_t uid)
{
    return uid >= p->base && uid < (uint64_t)p->base + p->count;
}

void uidpool_reserve(uidpool_t *p, uint32_t uid)
{
    if (!in_range(p, uid))
        return;
    uint8_t *s = &p->state[uid - p->base];
    if (*s == UID_RESERVED)
        return;
    if (*s == UID_USED)
        p->n_used--;
    *s = UID_RESERVED;
    p->n_reserved++;
}

/* passwd: name:x:uid:gid:...; group: name:x:gid:... — the third field is an id either way. */
int uidpool_reserve_from_file(uidpool_t *p, const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT ? 0 : negative_errno();
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *fields[4] = { 0 };
        size_t nf = 0;
        char *s = line;
        fields[nf++] = s;
        for (; *s && nf < 4; s++)
            if (*s == ':') {
                *s = '\0';
                fields[nf++] = s + 1;
            }
        for (size_t i = 2; i < nf && i < 4; i++) {
            char *e = fields[i];
            size_t n = strcspn(e, ":\n");
            uint64_t id;
            if (parse_u64(sv_make(e, n), UINT32_MAX, &id) == 0 && in_range(p, id))
                uidpool_reserve(p, (uint32_t)id);
        }
    }
    fclose(f);
    return 0;
}

int uidpool_reserve_from_proc(uidpool_t *p, const char *proc_path)
{
    DIR *d = opendir(proc_path);
    if (!d)
        return negative_errno();
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t pid;
        if (parse_u64_str(de->d_name, UINT32_MAX, &pid) < 0)
            continue;
        char path[320];
        (void)snprintf(path, sizeof path, "%s/%.255s/status", proc_path, de->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        char line[256];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "Uid:", 4) != 0)
                continue;
            /* real, effective, saved, fs */
            char *s = line + 4;
            for (int k = 0; k < 4; k++) {
                while (*s == '\t' || *s == ' ')
                    s++;
                size_t n = strspn(s, "0123456789");
                uint64_t id;
                if (n && parse_u64(sv_make(s, n), UINT32_MAX, &id) == 0 && in_range(p, id))
                    uidpool_reserve(p, (uint32_t)id);
                s += n;
            }
            break;
        }
        fclose(f);
    }
    closedir(d);
    return 0;
}

int uidpool_take(uidpool_t *p, uint32_t *ret)
{
    while (p->n_recycled > 0) {
        uint32_t uid = p->recycled[--p->n_recycled];
        uint8_t *s = &p->state[uid - p->base];
        if (*s != UID_FREE || !claim(p, uid))
            continue; /* reserved since it was recycled */
        *ret = uid;
        return 0;
    }
    while (p->next_fresh < p->count) {
        uint32_t off = p->next_fresh++;
        if (p->state[off] != UID_FREE || !claim(p, p->base + off))
            continue;
        *ret = p->base + off;
        return 0;
    }
    return -ENOSPC;
}

void uidpool_release(uidpool_t *p, uint32_t uid, bool verified)
{
    if (!in_range(p, uid))
        return;
    uint8_t *s = &p->state[uid - p->base];
    if (*s != UID_USED)
        return;
    p->n_used--;
    if (!verified) {
        *s = UID_QUARANTINE; /* and its lock stays held: no other pool takes it either */
        p->n_quarantined++;
        return;
    }
    (void)uid_lock(p, uid, F_UNLCK);
    *s = UID_FREE;
    p->recycled[p->n_recycled++] = uid;
}
