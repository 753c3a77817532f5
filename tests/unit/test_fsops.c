/* SPDX-License-Identifier: MIT */
/* File operations (src/server/fsops.c): lexical path normalization, and a confined root that
 * stays beneath its directory and never follows a symlink (the host-mode file API), with the
 * positive controls that show the same calls work on plain paths. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"
#include "server/fsops.h"
#include "tap.h"

/* ---- path_normalize ---------------------------------------------------------------------- */

static int norm(const char *in, char *out, size_t cap)
{
    return path_normalize(in, strlen(in), out, cap);
}

TEST(normalize_table)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        { "", "" },
        { "/", "" },
        { "a", "a" },
        { "/a/b/", "a/b" },
        { "a//b/./c", "a/b/c" },
        { "./.", "" },
        { "a/b/..", "a" },
        { "a/b/../../..", "" },
        { "../../x", "x" },
        { "/a/b/c/../../d", "a/d" },
        { "...", "..." },
        { "a/..b/.c", "a/..b/.c" },
        { "//..//../a//", "a" },
    };
    for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
        char out[64];
        int n = norm(cases[i].in, out, sizeof out);
        ASSERT_EQ(n, (int)strlen(cases[i].want));
        ASSERT_STREQ(out, cases[i].want);
    }
}

TEST(normalize_refuses_nul_and_overlong)
{
    char out[8];
    ASSERT_EQ(path_normalize("a\0b", 3, out, sizeof out), -EINVAL);
    ASSERT_EQ(norm("abcdefg", out, sizeof out), 7); /* control: exactly fits with its NUL */
    ASSERT_EQ(norm("abcdefgh", out, sizeof out), -ENAMETOOLONG);
    ASSERT_EQ(norm("abc/defg", out, sizeof out), -ENAMETOOLONG);
    ASSERT_EQ(norm("abcdefgh/..", out, sizeof out), -ENAMETOOLONG); /* no silent truncation */
    ASSERT_EQ(path_normalize("a", 1, out, 0), -ENAMETOOLONG);
    char name[NAME_MAX + 2];
    char big[FS_PATH_MAX];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    ASSERT_EQ(norm(name, big, sizeof big), -ENAMETOOLONG);
    name[NAME_MAX] = '\0';
    ASSERT_EQ(norm(name, big, sizeof big), NAME_MAX);
}

/* ---- a confined root --------------------------------------------------------------------- */

typedef struct {
    char base[64];
    int home;
} layout_t;

/* base/home/{sub/f, esc -> base/out, fl -> base/out/s, inlink -> sub}, base/out/s */
static int layout_make(layout_t *l)
{
    memcpy(l->base, "/tmp/sbx-fsops-XXXXXX", sizeof "/tmp/sbx-fsops-XXXXXX");
    if (!mkdtemp(l->base))
        return -errno;
    int b = open(l->base, O_PATH | O_DIRECTORY | O_CLOEXEC);
    char out[96], s[112];
    snprintf(out, sizeof out, "%s/out", l->base);
    snprintf(s, sizeof s, "%s/out/s", l->base);
    int r = mkdirat(b, "home", 0755) | mkdirat(b, "out", 0755) | mkdirat(b, "home/sub", 0755) |
            symlinkat(out, b, "home/esc") | symlinkat(s, b, "home/fl") |
            symlinkat("sub", b, "home/inlink");
    int f1 = openat(b, "out/s", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    int f2 = openat(b, "home/sub/f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    r |= (f1 < 0) | (f2 < 0) | (write(f1, "secret", 6) != 6);
    close(f1);
    close(f2);
    l->home = openat(b, "home", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(b);
    return r || l->home < 0 ? -EIO : 0;
}

static void layout_free(layout_t *l)
{
    fs_root_t d = fs_root_dedicated();
    close(l->home);
    (void)fs_delete(&d, l->base, true);
}

static bool exists_at(const layout_t *l, const char *rel)
{
    char p[256];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", l->base, rel);
    return lstat(p, &st) == 0;
}

TEST(confined_read_refuses_symlinks_and_stays_beneath)
{
    layout_t l;
    ASSERT_EQ(layout_make(&l), 0);
    fs_root_t r = { .dirfd = l.home, .confined = true, .uid = (uid_t)-1, .gid = (gid_t)-1 };
    int fd = -1;
    struct stat st;
    ASSERT_EQ(fs_open_read(&r, "/sub/f", &fd, &st), 0); /* control */
    close(fd);
    ASSERT_EQ(fs_open_read(&r, "../../../sub/f", &fd, &st), 0); /* ".." stops at the root */
    close(fd);
    ASSERT_EQ(fs_open_read(&r, "fl", &fd, &st), -ELOOP);
    ASSERT_EQ(fs_open_read(&r, "esc/s", &fd, &st), -ELOOP);
    ASSERT_EQ(fs_open_read(&r, "inlink/f", &fd, &st), -ELOOP); /* even one pointing inside */
    ASSERT_EQ(fs_open_read(&r, "/", &fd, &st), -EISDIR);
    fs_root_t d = fs_root_dedicated(); /* control: ordinary resolution follows the link */
    char p[128];
    snprintf(p, sizeof p, "%s/home/fl", l.base);
    ASSERT_EQ(fs_open_read(&d, p, &fd, &st), 0);
    ASSERT_EQ(st.st_size, 6);
    close(fd);
    layout_free(&l);
}

TEST(confined_write_and_mkdir_never_leave_the_root)
{
    layout_t l;
    ASSERT_EQ(layout_make(&l), 0);
    bool root = geteuid() == 0;
    fs_root_t r = { .dirfd = l.home,
                    .confined = true,
                    .uid = root ? 12345 : (uid_t)-1,
                    .gid = root ? 12345 : (gid_t)-1 };
    /* a sandbox's home is its own: what is made in it is made as its uid (fsuid) */
    if (root)
        ASSERT_EQ(fchown(l.home, 12345, 12345), 0);
    fs_write_opts_t o = { .truncate = true,
                          .mkdir = true,
                          .set_mode = true,
                          .mode = 0640,
                          .create_mode = 0600,
                          .dir_mode = 0700 };
    int fd = -1;
    ASSERT_EQ(fs_open_write(&r, "esc/new", &o, &fd), -ELOOP);
    ASSERT_EQ(fs_open_write(&r, "fl", &o, &fd), -ELOOP);
    ASSERT_EQ(fs_open_write(&r, "esc/a/b/new", &o, &fd), -ELOOP);
    ASSERT_EQ(fs_mkdir_all(&r, "esc/m", 0700), -ELOOP);
    ASSERT_FALSE(exists_at(&l, "out/new") || exists_at(&l, "out/a") || exists_at(&l, "out/m"));
    ASSERT_EQ(fs_open_write(&r, "x/y/z", &o, &fd), 0); /* control */
    close(fd);
    struct stat st;
    char p[128];
    snprintf(p, sizeof p, "%s/home/x/y/z", l.base);
    ASSERT_EQ(stat(p, &st), 0);
    ASSERT_EQ(st.st_mode & 07777, 0640);
    if (root)
        ASSERT_EQ(st.st_uid, 12345);
    snprintf(p, sizeof p, "%s/home/x/y", l.base);
    ASSERT_EQ(stat(p, &st), 0);
    if (root)
        ASSERT_EQ(st.st_uid, 12345); /* created parents belong to the sandbox too */
    layout_free(&l);
}

TEST(confined_stat_list_delete_rename)
{
    layout_t l;
    ASSERT_EQ(layout_make(&l), 0);
    fs_root_t r = { .dirfd = l.home, .confined = true, .uid = (uid_t)-1, .gid = (gid_t)-1 };
    struct stat st;
    ASSERT_EQ(fs_stat(&r, "esc", &st), 0);
    ASSERT_TRUE(S_ISLNK(st.st_mode));
    ASSERT_EQ(fs_stat(&r, "esc/s", &st), -ELOOP);
    ASSERT_EQ(fs_stat(&r, "/", &st), 0);
    ASSERT_TRUE(S_ISDIR(st.st_mode));
    fs_listing_t li;
    ASSERT_EQ(fs_list(&r, "esc", NULL, 10, &li), -ELOOP);
    ASSERT_EQ(fs_list(&r, "/", NULL, 10, &li), 0);
    ASSERT_EQ(li.n, 4);
    ASSERT_STREQ(li.entries[0].name, "esc");
    ASSERT_STREQ(li.entries[3].name, "sub");
    fs_listing_free(&li);
    ASSERT_EQ(fs_list(&r, "/", "fl", 1, &li), 0); /* cursor and page size */
    ASSERT_EQ(li.n, 1);
    ASSERT_STREQ(li.entries[0].name, "inlink");
    ASSERT_TRUE(li.truncated);
    fs_listing_free(&li);
    ASSERT_EQ(fs_delete(&r, "/", true), -EINVAL); /* never the root itself */
    ASSERT_EQ(fs_delete(&r, "..", true), -EINVAL);
    ASSERT_EQ(fs_rename(&r, "esc/s", "stolen", false), -ELOOP);
    ASSERT_EQ(fs_rename(&r, "sub/f", "g", false), 0);
    ASSERT_EQ(fs_rename(&r, "g", "fl", false), -EEXIST);
    ASSERT_EQ(fs_delete(&r, "esc", true), 0); /* the link goes, its target stays */
    ASSERT_TRUE(exists_at(&l, "out/s"));
    ASSERT_FALSE(exists_at(&l, "home/esc"));
    layout_free(&l);
}

TEST(recursive_delete_depth_is_bounded)
{
    char base[] = "/tmp/sbx-fsops-deep-XXXXXX";
    ASSERT_TRUE(mkdtemp(base) != NULL);
    int dfd = open(base, O_PATH | O_DIRECTORY | O_CLOEXEC);
    for (int i = 0; i < FS_DELETE_MAX_DEPTH + 4 && dfd >= 0; i++) {
        (void)mkdirat(dfd, "d", 0755);
        int n = openat(dfd, "d", O_PATH | O_DIRECTORY | O_CLOEXEC);
        close(dfd);
        dfd = n;
    }
    ASSERT_GE(dfd, 0);
    close(dfd);
    fs_root_t d = fs_root_dedicated();
    ASSERT_EQ(fs_delete(&d, base, true), -ENAMETOOLONG);
    /* clean up: first the deep half (within the bound from there), then the rest */
    char p[FS_PATH_MAX];
    size_t n = (size_t)snprintf(p, sizeof p, "%s", base);
    for (int i = 0; i < FS_DELETE_MAX_DEPTH / 2; i++)
        n += (size_t)snprintf(p + n, sizeof p - n, "/d");
    ASSERT_EQ(fs_delete(&d, p, true), 0);
    ASSERT_EQ(fs_delete(&d, base, true), 0);
}

/* rmtree (common/fileio.c), the node's rm -rf --one-file-system: symlinks go, their targets
 * stay; a path that is not there is fine. */
TEST(rmtree_unlinks_symlinks_and_keeps_their_targets)
{
    char base[] = "/tmp/sbx-rmtree-XXXXXX";
    ASSERT_TRUE(mkdtemp(base) != NULL);
    int b = open(base, O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(b, 0);
    ASSERT_EQ(mkdirat(b, "keep", 0755), 0);
    ASSERT_EQ(close(openat(b, "keep/file", O_WRONLY | O_CREAT | O_CLOEXEC, 0644)), 0);
    ASSERT_EQ(mkdirat(b, "t", 0755), 0);
    ASSERT_EQ(mkdirat(b, "t/sub", 0755), 0);
    ASSERT_EQ(close(openat(b, "t/sub/f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644)), 0);
    char target[PATH_MAX];
    (void)snprintf(target, sizeof target, "%s/keep", base);
    ASSERT_EQ(symlinkat(target, b, "t/dirlink"), 0);
    char t[PATH_MAX];
    (void)snprintf(t, sizeof t, "%s/t", base);
    ASSERT_EQ(rmtree(t), 0);
    ASSERT_EQ(faccessat(b, "t", F_OK, AT_SYMLINK_NOFOLLOW), -1);
    ASSERT_EQ(faccessat(b, "keep/file", F_OK, 0), 0); /* the link's target is untouched */
    ASSERT_EQ(rmtree(t), 0);                          /* not there: fine */
    close(b);
    ASSERT_EQ(rmtree(base), 0);
    ASSERT_EQ(access(base, F_OK), -1);
}

TEST(confined_readlink_reads_the_link_itself)
{
    layout_t l;
    ASSERT_EQ(layout_make(&l), 0);
    fs_root_t r = { .dirfd = l.home, .confined = true, .uid = (uid_t)-1, .gid = (gid_t)-1 };
    char t[FS_PATH_MAX];
    ASSERT_EQ(fs_readlink(&r, "/inlink", t, sizeof t), 3);
    ASSERT_STREQ(t, "sub");
    char want[112];
    snprintf(want, sizeof want, "%s/out", l.base);
    ASSERT_EQ(fs_readlink(&r, "esc", t, sizeof t), (int)strlen(want)); /* read, not followed */
    ASSERT_STREQ(t, want);
    ASSERT_EQ(fs_readlink(&r, "esc/s", t, sizeof t), -ELOOP);  /* nor walked through */
    ASSERT_EQ(fs_readlink(&r, "sub/f", t, sizeof t), -EINVAL); /* not a link */
    char small[3];
    ASSERT_EQ(fs_readlink(&r, "inlink", small, sizeof small), 2); /* cut to fit, terminated */
    ASSERT_STREQ(small, "su");
    layout_free(&l);
}

TAP_MAIN(T(normalize_table), T(normalize_refuses_nul_and_overlong),
         T(confined_read_refuses_symlinks_and_stays_beneath),
         T(confined_write_and_mkdir_never_leave_the_root), T(confined_stat_list_delete_rename),
         T(recursive_delete_depth_is_bounded), T(rmtree_unlinks_symlinks_and_keeps_their_targets),
         T(confined_readlink_reads_the_link_itself))
