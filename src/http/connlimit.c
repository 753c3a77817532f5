/* SPDX-License-Identifier: MIT */
/* Fair connection limits: keyed counters, source keys, accept-time admission and the
 * unauthenticated group (policy: connlimit.h). */
#include "connlimit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>

#include "conn.h"
#include "http/httpd.h"

/* Closing a connection to make room looks at this many of the oldest unauthenticated ones: a
 * connection there that is not waiting for a head is in a request, which ends soon. */
#define CLIMIT_SHED_SCAN 64

struct climit_ent {
    climit_ent_t *next;
    climit_tab_t *tab;
    uint64_t count;
    uint64_t hash;
    uint8_t len;
    uint8_t key[CLIMIT_KEY_MAX];
};

struct climit_tab {
    climit_ent_t **buckets;
    size_t n_buckets; /* a power of two */
    size_t n;
    /* keyed hash (SipHash): a peer choosing addresses or names cannot aim at one bucket */
    unsigned char k[crypto_shorthash_KEYBYTES];
};

int climit_tab_new(climit_tab_t **ret)
{
    if (sodium_init() < 0)
        return -EIO;
    climit_tab_t *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->n_buckets = 64;
    t->buckets = calloc(t->n_buckets, sizeof *t->buckets);
    if (!t->buckets) {
        free(t);
        return -ENOMEM;
    }
    crypto_shorthash_keygen(t->k);
    *ret = t;
    return 0;
}

climit_tab_t *climit_tab_free(climit_tab_t *t)
{
    if (!t)
        return NULL;
    for (size_t i = 0; i < t->n_buckets; i++)
        for (climit_ent_t *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    free(t->buckets);
    free(t);
    return NULL;
}

static uint64_t tab_hash(const climit_tab_t *t, const void *key, size_t len)
{
    unsigned char h[crypto_shorthash_BYTES];
    (void)crypto_shorthash(h, key, len, t->k);
    uint64_t v;
    memcpy(&v, h, sizeof v);
    return v;
}

/* Double the buckets when keys outnumber them (best effort: a failed grow only costs speed). */
static void tab_grow(climit_tab_t *t)
{
    size_t nb;
    if (t->n < t->n_buckets || !size_mul_ok(t->n_buckets, 2, &nb))
        return;
    climit_ent_t **b = calloc(nb, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < t->n_buckets; i++)
        for (climit_ent_t *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t j = e->hash & (nb - 1);
            e->next = b[j];
            b[j] = e;
        }
    free(t->buckets);
    t->buckets = b;
    t->n_buckets = nb;
}

int climit_acquire(climit_tab_t *t, const void *key, size_t len, uint64_t limit, climit_ent_t **ret)
{
    if (!t || len == 0 || len > CLIMIT_KEY_MAX)
        return -EINVAL;
    uint64_t h = tab_hash(t, key, len);
    climit_ent_t **slot = &t->buckets[h & (t->n_buckets - 1)];
    for (climit_ent_t *e = *slot; e; e = e->next)
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) {
            if (limit > 0 && e->count >= limit)
                return -EUSERS;
            e->count++;
            *ret = e;
            return 0;
        }
    climit_ent_t *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    *e = (climit_ent_t){ .next = *slot, .tab = t, .count = 1, .hash = h, .len = (uint8_t)len };
    memcpy(e->key, key, len);
    *slot = e;
    t->n++;
    tab_grow(t);
    *ret = e;
    return 0;
}

void climit_release(climit_ent_t *e)
{
    if (!e || --e->count > 0)
        return;
    climit_tab_t *t = e->tab;
    for (climit_ent_t **pp = &t->buckets[e->hash & (t->n_buckets - 1)]; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            t->n--;
            break;
        }
    free(e);
}

uint64_t climit_count(const climit_ent_t *e) { return e ? e->count : 0; }
size_t climit_tab_size(const climit_tab_t *t) { return t ? t->n : 0; }

void climit_hold_release(climit_hold_t *h)
{
    climit_release(h->source);
    climit_release(h->owner);
    *h = (climit_hold_t){ 0 };
}

/* ---- sources ------------------------------------------------------------------------------ */

size_t climit_source_key(const struct sockaddr *sa, socklen_t len, uint8_t key[CLIMIT_SOURCE_KEY])
{
    memset(key, 0, CLIMIT_SOURCE_KEY);
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        key[0] = 4;
        memcpy(key + 1, &a->sin_addr, 4);
        return CLIMIT_SOURCE_KEY;
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
            key[0] = 4;
            memcpy(key + 1, a->sin6_addr.s6_addr + 12, 4);
        } else {
            key[0] = 6;
            memcpy(key + 1, a->sin6_addr.s6_addr, 8); /* the /64: one host's (or site's) share */
        }
        return CLIMIT_SOURCE_KEY;
    }
    return 0;
}

int climit_source_key_parse(const char *addr, uint8_t key[CLIMIT_SOURCE_KEY])
{
    struct sockaddr_in a4 = { .sin_family = AF_INET };
    struct sockaddr_in6 a6 = { .sin6_family = AF_INET6 };
    char buf[INET6_ADDRSTRLEN + 2];
    size_t n = strlen(addr);
    if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']' && n - 2 < sizeof buf) {
        memcpy(buf, addr + 1, n - 2);
        buf[n - 2] = 0;
        addr = buf;
    }
    if (inet_pton(AF_INET, addr, &a4.sin_addr) == 1)
        return climit_source_key((struct sockaddr *)&a4, sizeof a4, key) ? 0 : -EINVAL;
    if (inet_pton(AF_INET6, addr, &a6.sin6_addr) == 1)
        return climit_source_key((struct sockaddr *)&a6, sizeof a6, key) ? 0 : -EINVAL;
    return -EINVAL;
}

static bool source_exempt(const httpd_config_t *cfg, const uint8_t key[CLIMIT_SOURCE_KEY])
{
    for (size_t i = 0; i < cfg->n_exempt && i < CLIMIT_EXEMPT_MAX; i++)
        if (memcmp(cfg->exempt[i], key, CLIMIT_SOURCE_KEY) == 0)
            return true;
    return false;
}

/* ---- the unauthenticated group -------------------------------------------------------------- */

static void unauth_unlink(conn_t *c)
{
    httpd_t *s = c->srv;
    if (c->unauth_prev)
        c->unauth_prev->unauth_next = c->unauth_next;
    else if (s->unauth_old == c)
        s->unauth_old = c->unauth_next;
    if (c->unauth_next)
        c->unauth_next->unauth_prev = c->unauth_prev;
    else if (s->unauth_new == c)
        s->unauth_new = c->unauth_prev;
    c->unauth_prev = c->unauth_next = NULL;
    s->n_unauth--;
}

/* Close the oldest unauthenticated connection that waits for a request head. */
static bool shed_oldest_waiting(httpd_t *s)
{
    conn_t *c = s->unauth_old;
    for (int i = 0; c && i < CLIMIT_SHED_SCAN; i++, c = c->unauth_next)
        if (c->state == CS_HEAD && !c->dead) {
            conn_abort(c); /* leaves the table and the group now */
            return true;
        }
    return false;
}

int climit_admit(httpd_t *s, const struct sockaddr *sa, socklen_t len, climit_hold_t *ret)
{
    const httpd_config_t *cfg = &s->cfg;
    climit_hold_t h = { 0 };
    uint8_t key[CLIMIT_SOURCE_KEY];
    size_t kl = s->sources ? climit_source_key(sa, len, key) : 0;
    if (kl > 0 && !source_exempt(cfg, key)) {
        int r = climit_acquire(s->sources, key, kl, cfg->max_conns_per_source, &h.source);
        if (r < 0)
            return r == -EUSERS ? -EUSERS : -EBUSY;
    }
    bool full = s->n_conns + s->n_tunnels >= cfg->max_connections;
    if (cfg->max_unauth_conns > 0 && (full || s->n_unauth >= cfg->max_unauth_conns)) {
        if (!shed_oldest_waiting(s)) {
            climit_hold_release(&h);
            return -EBUSY;
        }
        full = s->n_conns + s->n_tunnels >= cfg->max_connections;
    }
    if (full) {
        climit_hold_release(&h);
        return -EBUSY;
    }
    *ret = h;
    return 0;
}

void climit_conn_added(conn_t *c, climit_hold_t *hold)
{
    httpd_t *s = c->srv;
    c->lim = *hold;
    *hold = (climit_hold_t){ 0 };
    c->lim_authed = false;
    c->head_wait_ms = c->last_progress_ms;
    c->unauth_next = NULL;
    c->unauth_prev = s->unauth_new;
    if (s->unauth_new)
        s->unauth_new->unauth_next = c;
    else
        s->unauth_old = c;
    s->unauth_new = c;
    s->n_unauth++;
}

void climit_conn_removed(conn_t *c)
{
    if (!c->lim_authed) {
        unauth_unlink(c);
        c->lim_authed = true; /* out of the group: never unlinked twice */
    }
    climit_hold_release(&c->lim);
}

uint64_t climit_head_due(const conn_t *c, uint64_t due)
{
    uint64_t t = c->srv->cfg.unauth_head_timeout_ms;
    if (c->lim_authed || t == 0)
        return due;
    return MIN(due, c->head_wait_ms + t);
}

void climit_authenticated(conn_t *c)
{
    if (c->dead || c->lim_authed)
        return;
    unauth_unlink(c);
    c->lim_authed = true;
}

int climit_set_owner(conn_t *c, climit_tab_t *t, const void *key, size_t len, uint64_t limit)
{
    climit_ent_t *cur = c->lim.owner, *e;
    if (c->dead)
        return -EPIPE; /* what it held is released already */
    if (cur && cur->tab == t && cur->len == len && memcmp(cur->key, key, len) == 0)
        return 0;
    int r = climit_acquire(t, key, len, limit, &e);
    if (r < 0)
        return r;
    climit_release(cur);
    c->lim.owner = e;
    return 0;
}
