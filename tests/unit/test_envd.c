/* SPDX-License-Identifier: MIT */
/* envd's pure parts (src/server/envd.c, envd_files.c): Connect envelopes, the error codes'
 * names and statuses, and the multipart/form-data reader of POST /files. */
#include <stdlib.h>
#include <string.h>

#include "server/envd.h"
#include "tap.h"

TEST(envelope_complete)
{
    const char msg[] = "\x00\x00\x00\x00\x02{}";
    uint8_t flags = 0xff;
    size_t len = 99;
    ASSERT_EQ(envd_envelope_parse(msg, 7, 100, &flags, &len), 7);
    ASSERT_EQ(flags, 0);
    ASSERT_EQ_U(len, 2);
    /* the end-stream flag is reported as sent */
    const char end[] = "\x02\x00\x00\x00\x00";
    ASSERT_EQ(envd_envelope_parse(end, 5, 100, &flags, &len), 5);
    ASSERT_EQ(flags, 2);
    ASSERT_EQ_U(len, 0);
}

TEST(envelope_needs_more)
{
    const char msg[] = "\x00\x00\x00\x00\x02{}";
    uint8_t flags;
    size_t len;
    for (size_t n = 0; n < 7; n++)
        ASSERT_EQ(envd_envelope_parse(msg, n, 100, &flags, &len), 0);
}

TEST(envelope_length_is_big_endian_and_capped)
{
    char msg[5 + 300];
    memset(msg, 'x', sizeof msg);
    envd_envelope_header(msg, 0, 300);
    ASSERT_EQ((unsigned char)msg[3], 1);
    ASSERT_EQ((unsigned char)msg[4], 44);
    uint8_t flags;
    size_t len;
    ASSERT_EQ(envd_envelope_parse(msg, sizeof msg, 300, &flags, &len), 305);
    ASSERT_EQ_U(len, 300);
    ASSERT_EQ(envd_envelope_parse(msg, sizeof msg, 299, &flags, &len), -EMSGSIZE);
    /* a huge declared length is refused before any payload arrives */
    const char huge[] = "\x00\xff\xff\xff\xff";
    ASSERT_EQ(envd_envelope_parse(huge, 5, ENVD_MAX_MESSAGE, &flags, &len), -EMSGSIZE);
    /* two envelopes back to back: the first one's length only */
    char two[14];
    envd_envelope_header(two, 0, 2);
    memcpy(two + 5, "{}", 2);
    envd_envelope_header(two + 7, 2, 2);
    memcpy(two + 12, "{}", 2);
    ASSERT_EQ(envd_envelope_parse(two, sizeof two, 100, &flags, &len), 7);
}

TEST(codes)
{
    ASSERT_STREQ(connect_code_name(CONNECT_NOT_FOUND), "not_found");
    ASSERT_EQ(connect_code_status(CONNECT_NOT_FOUND), 404);
    ASSERT_STREQ(connect_code_name(CONNECT_UNAUTHENTICATED), "unauthenticated");
    ASSERT_EQ(connect_code_status(CONNECT_UNAUTHENTICATED), 401);
    ASSERT_EQ(connect_code_status(CONNECT_DEADLINE_EXCEEDED), 504);
    ASSERT_EQ(connect_code_status(CONNECT_UNIMPLEMENTED), 501);
    ASSERT_EQ(connect_code_status(CONNECT_RESOURCE_EXHAUSTED), 429);
    ASSERT_STREQ(connect_code_name((connect_code_t)0), "unknown");
    ASSERT_STREQ(connect_code_name((connect_code_t)99), "unknown");
    ASSERT_EQ(connect_code_from_errno(-ENOENT), CONNECT_NOT_FOUND);
    ASSERT_EQ(connect_code_from_errno(-EEXIST), CONNECT_ALREADY_EXISTS);
    ASSERT_EQ(connect_code_from_errno(-EACCES), CONNECT_PERMISSION_DENIED);
}

TEST(multipart_boundary)
{
    char b[80];
    ASSERT_EQ(envd_multipart_boundary(SV("multipart/form-data; boundary=abc"), b, sizeof b), 3);
    ASSERT_STREQ(b, "abc");
    ASSERT_EQ(
        envd_multipart_boundary(SV("multipart/form-data; BOUNDARY=\"a b\"; x=1"), b, sizeof b), 3);
    ASSERT_STREQ(b, "a b");
    ASSERT_EQ(envd_multipart_boundary(SV("multipart/form-data"), b, sizeof b), -EINVAL);
    ASSERT_EQ(envd_multipart_boundary(SV("multipart/form-data; boundary="), b, sizeof b), -EINVAL);
}

TEST(multipart_parts)
{
    static const char body[] = "preamble\r\n"
                               "--XB\r\n"
                               "Content-Disposition: form-data; name=\"file\"; "
                               "filename=\"/home/user/a \\\"q\\\".txt\"\r\n"
                               "Content-Type: application/octet-stream\r\n"
                               "\r\n"
                               "one\r\n--XBnot-a-delimiter\r\n"
                               "--XB\r\n"
                               "content-disposition: form-data; name=file; filename=b\r\n"
                               "\r\n"
                               "\r\n"
                               "--XB--\r\n";
    size_t pos = 0;
    envd_part_t p;
    ASSERT_EQ(envd_multipart_next(body, sizeof body - 1, "XB", &pos, &p), 1);
    ASSERT_TRUE(p.has_name && p.has_filename);
    ASSERT_STREQ(p.name, "file");
    ASSERT_STREQ(p.filename, "/home/user/a \"q\".txt");
    ASSERT_MEMEQ(p.data, p.len, "one\r\n--XBnot-a-delimiter", 24);
    ASSERT_EQ(envd_multipart_next(body, sizeof body - 1, "XB", &pos, &p), 1);
    ASSERT_STREQ(p.filename, "b");
    ASSERT_EQ_U(p.len, 0);
    ASSERT_EQ(envd_multipart_next(body, sizeof body - 1, "XB", &pos, &p), 0);
}

TEST(multipart_malformed)
{
    static const char *const bad[] = {
        "",
        "--XB",
        "--XB\r\nContent-Disposition: form-data; name=\"file\"\r\n",
        "--XB\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nno end",
        "--XB\r\nContent-Disposition: form-data; name=\"unterminated\r\n\r\nx\r\n--XB--",
        "--XBjunk\r\n",
    };
    for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
        size_t pos = 0;
        envd_part_t p;
        int r = envd_multipart_next(bad[i], strlen(bad[i]), "XB", &pos, &p);
        if (r == 1) /* the unterminated quote: the part is read, its name is not */
            ASSERT_FALSE(p.has_name);
        else
            ASSERT_EQ(r, -EINVAL);
    }
}

TAP_MAIN(T(envelope_complete), T(envelope_needs_more), T(envelope_length_is_big_endian_and_capped),
         T(codes), T(multipart_boundary), T(multipart_parts), T(multipart_malformed))
