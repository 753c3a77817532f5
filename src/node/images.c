/* SPDX-License-Identifier: MIT */
/* The node's verified image set (image.h): a startup scan of --images, a rescan thread, what
 * registration and heartbeats report, and image_rootfs for installs. */
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "common/log.h"
#include "image.h"
#include "node.h"

#define RESCAN_MS 5000

static int mkdir_parents(const char *dir)
{
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p || dir[0] != '/')
        return -EINVAL;
    memcpy(p, dir, n + 1);
    for (char *s = p + 1;; s++) {
        bool end = *s == 0;
        if (*s == '/' || end) {
            *s = 0;
            if (mkdir(p, 0755) < 0 && errno != EEXIST)
                return negative_errno();
            if (end)
                break;
            *s = '/';
        }
    }
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* Log a failure once per distinct reason, not every rescan. */
static void note_errors(node_images_t *im, const image_entry_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!v[i].error)
            continue;
        bool known = false;
        for (size_t k = 0; k < im->n_bad; k++)
            known |= streq(im->bad[k].img.name, v[i].img.name) && streq(im->bad[k].why, v[i].why);
        if (!known)
            log_warn("%s: not offered", v[i].why);
    }
    free(im->bad);
    im->bad = NULL;
    im->n_bad = 0;
    image_entry_t *bad = calloc(n ? n : 1, sizeof *bad);
    if (!bad)
        return;
    for (size_t i = 0; i < n; i++)
        if (v[i].error)
            bad[im->n_bad++] = v[i];
    im->bad = bad;
}

static void scan(node_t *n, unsigned flags)
{
    node_images_t *im = &n->images;
    image_entry_t *v;
    size_t k;
    int r = image_list(n->cfg.images_dir, flags, &v, &k);
    if (r < 0) {
        log_warn("images directory %s: %s", n->cfg.images_dir, strerror(-r));
        return;
    }
    image_t *ok = calloc(k ? k : 1, sizeof *ok);
    size_t m = 0;
    if (!ok) {
        free(v);
        return;
    }
    for (size_t i = 0; i < k; i++)
        if (!v[i].error)
            ok[m++] = v[i].img;
    pthread_mutex_lock(&im->lock);
    for (size_t i = 0; i < m; i++) {
        bool known = false;
        for (size_t j = 0; j < im->n; j++)
            known |= streq(im->v[j].name, ok[i].name) && streq(im->v[j].digest, ok[i].digest);
        if (!known)
            log_info("image %s: %s, %llu MiB unpacked in %s", ok[i].name, ok[i].digest,
                     (unsigned long long)(ok[i].size >> 20), ok[i].rootfs);
    }
    free(im->v);
    im->v = ok;
    im->n = m;
    note_errors(im, v, k);
    pthread_mutex_unlock(&im->lock);
    free(v);
}

int node_images_init(node_t *n)
{
    node_images_t *im = &n->images;
    pthread_mutex_init(&im->lock, NULL);
    im->inited = true;
    int r = mkdir_parents(n->cfg.images_dir);
    if (r < 0) {
        log_error("images directory %s: %s", n->cfg.images_dir, strerror(-r));
        return r;
    }
    scan(n, IMAGE_VERIFY_ALL); /* every blob hashed once per start */
    return 0;
}

static void *rescan_main(void *p)
{
    node_t *n = p;
    while (!n->images.stopping) {
        for (int i = 0; i < RESCAN_MS / 50 && !n->images.stopping; i++) {
            struct timespec ts = { 0, 50 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        if (!n->images.stopping)
            scan(n, 0);
    }
    return NULL;
}

int node_images_start(node_t *n)
{
    int r = pthread_create(&n->images.thread, NULL, rescan_main, n);
    if (r != 0)
        return -r;
    n->images.started = true;
    return 0;
}

void node_images_stop(node_t *n)
{
    node_images_t *im = &n->images;
    im->stopping = true;
    if (im->started)
        (void)pthread_join(im->thread, NULL);
    im->started = false;
    if (im->inited) {
        free(im->v);
        free(im->bad);
        im->v = NULL;
        im->bad = NULL;
        im->n = im->n_bad = 0;
        pthread_mutex_destroy(&im->lock);
        im->inited = false;
    }
}

json_t *node_images_json(node_t *n)
{
    node_images_t *im = &n->images;
    json_t *arr = json_array();
    if (!arr || !im->inited)
        return arr;
    pthread_mutex_lock(&im->lock);
    for (size_t i = 0; i < im->n; i++)
        json_array_append_new(arr, json_pack("{s:s,s:s,s:I}", "name", im->v[i].name, "digest",
                                             im->v[i].digest, "size", (json_int_t)im->v[i].size));
    pthread_mutex_unlock(&im->lock);
    return arr;
}

static int answer(const image_t *img, char *ret_path, size_t cap, char *ret_digest, sbx_err_t *err)
{
    size_t l = strlen(img->rootfs);
    if (l >= cap)
        return sbx_err(err, -ENAMETOOLONG, "image %s: the rootfs path is too long", img->name);
    memcpy(ret_path, img->rootfs, l + 1);
    if (ret_digest)
        memcpy(ret_digest, img->digest, IMAGE_DIGEST_MAX);
    return 0;
}

int image_rootfs(node_t *n, const char *name, char *ret_path, size_t cap, char *ret_digest,
                 sbx_err_t *err)
{
    node_images_t *im = &n->images;
    image_t img;
    bool found = false;
    if (!im->inited)
        return sbx_err(err, -ENOENT, "image %s: this node serves no images", name);
    pthread_mutex_lock(&im->lock);
    for (size_t i = 0; i < im->n && !found; i++)
        if (streq(im->v[i].name, name)) {
            img = im->v[i];
            found = true;
        }
    pthread_mutex_unlock(&im->lock);
    struct stat st;
    if (found && stat(img.rootfs, &st) == 0 && S_ISDIR(st.st_mode))
        return answer(&img, ret_path, cap, ret_digest, err);
    /* not verified yet (added since the last scan) or its rootfs went away: resolve now */
    int r = image_resolve(n->cfg.images_dir, name, 0, &img, err);
    if (r < 0)
        return r;
    pthread_mutex_lock(&im->lock);
    size_t i = 0;
    while (i < im->n && !streq(im->v[i].name, name))
        i++;
    image_t *nv = i < im->n ? im->v : realloc(im->v, (im->n + 1) * sizeof *nv);
    if (nv) {
        im->v = nv;
        im->v[i] = img;
        im->n += i == im->n;
    }
    pthread_mutex_unlock(&im->lock);
    return answer(&img, ret_path, cap, ret_digest, err);
}
