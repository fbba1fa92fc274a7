/* edgebroker native helper (built with cffi in API mode; see edgebroker/_native/_build.py).
 *
 * What is here, and why in C: the loops that touch every byte or every record of the commit log
 * (CRC32C, record validation, index rebuild, topic-filter scans), binary search over the index,
 * sending several (header, file range) pairs to a socket in one call, and allocating a file's
 * blocks ahead (fallocate).
 * Each function has a pure-Python twin in edgebroker/_native/_pure.py with identical results;
 * the test suite checks the two against each other on random inputs.
 *
 * The on-disk layout parsed here is documented byte by byte in docs/log-format.md. All integers
 * on disk are little-endian; they are read and written byte by byte, so the code does not depend
 * on the host's byte order or alignment.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "edgebroker_native.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define EB_HAVE_X86_CRC 1
#endif

#if defined(__aarch64__) && defined(__GNUC__) && !defined(__clang__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define EB_HAVE_ARM_CRC 1
#endif

/* ------------------------------------------------------------------------------------------ */
/* Little-endian loads and stores                                                              */

static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

static inline void st16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

static inline void st32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

static inline void st64(uint8_t *p, uint64_t v) { st32(p, (uint32_t)v); st32(p + 4, (uint32_t)(v >> 32)); }

/* ------------------------------------------------------------------------------------------ */
/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78; init and final xor 0xFFFFFFFF)          */
/* Software: slicing-by-8. Hardware when the CPU has it (SSE4.2 on x86-64, CRC on ARMv8),       */
/* chosen once when the module is loaded.                                                      */

static uint32_t crc_table[8][256];

static void crc_init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

/* The hardware instruction takes a few cycles to give its result but can start one per
   cycle: inputs of three lanes or more run three independent CRCs over three consecutive
   CRC_LANE-byte blocks at a time, then join them. Joining uses
   crc(c, A || B) = zeros(crc(c, A), |B|) ^ crc(0, B), where zeros(x, n) is the register
   after n zero bytes from x: linear in x, so a 4 x 256 table per byte of x (n = CRC_LANE). */
#define CRC_LANE 1024
static uint32_t crc_shift_table[4][256];

static void crc_init_shift(void)
{
    uint32_t basis[32];
    for (int bit = 0; bit < 32; bit++) {
        uint32_t c = 1u << bit;
        for (int i = 0; i < CRC_LANE; i++)
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
        basis[bit] = c;
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t c = 0;
            for (int bit = 0; bit < 8; bit++)
                if (b & (1u << bit))
                    c ^= basis[8 * k + bit];
            crc_shift_table[k][b] = c;
        }
}

/* The register after CRC_LANE zero bytes from `c`. */
static inline uint32_t crc_shift(uint32_t c)
{
    return crc_shift_table[0][c & 0xFF] ^ crc_shift_table[1][(c >> 8) & 0xFF] ^
           crc_shift_table[2][(c >> 16) & 0xFF] ^ crc_shift_table[3][c >> 24];
}

/* Three lanes' registers (over blocks A, B, C from `a`, 0, 0) as one over A || B || C. */
static inline uint32_t crc_join3(uint32_t a, uint32_t b, uint32_t c)
{
    return crc_shift(crc_shift(a) ^ b) ^ c;
}

/* Raw update: `c` is the running (already inverted) register. */
static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = ld32(p) ^ c;
        uint32_t hi = ld32(p + 4);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#ifdef EB_HAVE_X86_CRC
__attribute__((target("sse4.2"))) static uint32_t crc_x86(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
    c64 = c;
    while (n >= 3 * CRC_LANE) {
        uint64_t a = c64, b = 0, d = 0;
        for (size_t i = 0; i < CRC_LANE; i += 8) {
            uint64_t va, vb, vd;
            memcpy(&va, p + i, 8);
            memcpy(&vb, p + CRC_LANE + i, 8);
            memcpy(&vd, p + 2 * CRC_LANE + i, 8);
            a = _mm_crc32_u64(a, va);
            b = _mm_crc32_u64(b, vb);
            d = _mm_crc32_u64(d, vd);
        }
        c64 = crc_join3((uint32_t)a, (uint32_t)b, (uint32_t)d);
        p += 3 * CRC_LANE;
        n -= 3 * CRC_LANE;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

#ifdef EB_HAVE_ARM_CRC
__attribute__((target("+crc"))) static uint32_t crc_arm(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_aarch64_crc32cb(c, *p++);
        n--;
    }
    while (n >= 3 * CRC_LANE) {
        uint32_t a = c, b = 0, d = 0;
        for (size_t i = 0; i < CRC_LANE; i += 8) {
            uint64_t va, vb, vd;
            memcpy(&va, p + i, 8);
            memcpy(&vb, p + CRC_LANE + i, 8);
            memcpy(&vd, p + 2 * CRC_LANE + i, 8);
            a = __builtin_aarch64_crc32cx(a, va);
            b = __builtin_aarch64_crc32cx(b, vb);
            d = __builtin_aarch64_crc32cx(d, vd);
        }
        c = crc_join3(a, b, d);
        p += 3 * CRC_LANE;
        n -= 3 * CRC_LANE;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_aarch64_crc32cx(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_aarch64_crc32cb(c, *p++);
    return c;
}
#endif

static uint32_t (*crc_update)(uint32_t, const uint8_t *, size_t) = crc_sw;
static const char *crc_method = "slicing-by-8";

__attribute__((constructor)) static void eb_init(void)
{
    crc_init_tables();
    crc_init_shift();
#ifdef EB_HAVE_X86_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_update = crc_x86;
        crc_method = "sse4.2";
    }
#endif
#ifdef EB_HAVE_ARM_CRC
    if (getauxval(AT_HWCAP) & HWCAP_CRC32) {
        crc_update = crc_arm;
        crc_method = "armv8-crc";
    }
#endif
}

uint32_t eb_crc32c(uint32_t crc, const uint8_t *buf, size_t len)
{
    return ~crc_update(~crc, buf, len);
}

const char *eb_crc32c_method(void) { return crc_method; }

/* ------------------------------------------------------------------------------------------ */
/* Records                                                                                     */

#define HDR EB_RECORD_HEADER_SIZE
#define PROPS EB_ATTR_PROPERTIES
#define MAX_PAYLOAD 268435455u
#define MAX_RECORD ((uint64_t)HDR + EB_PROPERTIES_LENGTH_SIZE + 65535u + 65535u + MAX_PAYLOAD)

/* The header of a record (format version 2): the 34 fixed bytes and, when there are properties,
 * their length R (u32) right after them, with the properties bit set in the attributes. Returns
 * the header's size: 34, or 38 with properties. */
size_t eb_record_header(char *out_, uint64_t offset, uint64_t timestamp_ms, uint32_t attributes,
                        const char *client_id, size_t client_id_len,
                        const char *topic, size_t topic_len,
                        const char *payload, size_t payload_len,
                        const char *properties, size_t properties_len)
{
    uint8_t *out = (uint8_t *)out_;
    size_t head = properties_len ? HDR + EB_PROPERTIES_LENGTH_SIZE : HDR;
    uint32_t c;
    attributes &= ~(uint32_t)PROPS;
    st32(out + 4, (uint32_t)(head + client_id_len + topic_len + properties_len + payload_len));
    st64(out + 8, offset);
    st64(out + 16, timestamp_ms);
    out[24] = (uint8_t)(properties_len ? attributes | PROPS : attributes);
    out[25] = 0;
    st16(out + 26, (uint16_t)client_id_len);
    st16(out + 28, (uint16_t)topic_len);
    st32(out + 30, (uint32_t)payload_len);
    if (properties_len)
        st32(out + HDR, (uint32_t)properties_len);
    c = crc_update(0xFFFFFFFFu, out + 4, head - 4);
    c = crc_update(c, (const uint8_t *)client_id, client_id_len);
    c = crc_update(c, (const uint8_t *)topic, topic_len);
    c = crc_update(c, (const uint8_t *)properties, properties_len);
    c = crc_update(c, (const uint8_t *)payload, payload_len);
    st32(out, ~c);
    return head;
}

/* The record just built at the end of the staging area (`nbytes` of it there, `length` in the
 * segment): its index entry, and the staging area's running fields. Returns its offset. */
static int64_t staged(eb_appender *a, int64_t timestamp_ms, uint64_t nbytes, uint64_t length)
{
    uint64_t offset = a->next_offset;
    uint8_t *e = a->index + a->count * EB_INDEX_ENTRY_SIZE;
    if (timestamp_ms > a->max_ts)
        a->max_ts = timestamp_ms;
    if (a->count == 0)
        a->staged_first_ts = timestamp_ms;
    st32(e, (uint32_t)(offset - a->base_offset));
    st32(e + 4, (uint32_t)a->position);
    st64(e + 8, (uint64_t)a->max_ts);
    a->used += nbytes;
    a->count++;
    a->position += length;
    a->next_offset = offset + 1;
    return (int64_t)offset;
}

/* The checks every staged record passes (`nbytes` of it staged, `length` in the segment; -1
 * when it fails one), then its header, client id, topic and properties at the end of the
 * staging area. */
static uint8_t *begin_record(eb_appender *a, int64_t timestamp_ms, int qos, int retain,
                             const char *client_id, size_t client_id_len,
                             const char *topic, size_t topic_len,
                             const char *payload, size_t payload_len,
                             const char *properties, size_t properties_len,
                             uint64_t nbytes, uint64_t length)
{
    uint64_t offset = a->next_offset, rel = offset - a->base_offset;
    uint8_t *out;
    size_t head;
    if (timestamp_ms < 0 || qos < 0 || qos > 2 || client_id_len > 0xFFFFu || topic_len > 0xFFFFu
        || properties_len > MAX_PAYLOAD
        || a->used + nbytes > a->capacity
        || a->count >= a->index_capacity || a->position + length > a->segment_bytes
        || timestamp_ms - a->first_ts >= a->segment_ms
        || rel > 0xFFFFFFFFu || a->position > 0xFFFFFFFFu)
        return NULL;
    out = a->buf + a->used;
    head = eb_record_header((char *)out, offset, (uint64_t)timestamp_ms,
                            (uint32_t)(qos | (retain ? 0x04 : 0)), client_id, client_id_len,
                            topic, topic_len, payload, payload_len, properties, properties_len);
    memcpy(out + head, client_id, client_id_len);
    memcpy(out + head + client_id_len, topic, topic_len);
    memcpy(out + head + client_id_len + topic_len, properties, properties_len);
    return out;
}

/* Bytes of a record before its payload: header, client id, topic, properties. */
static inline uint64_t record_prefix(size_t client_id_len, size_t topic_len, size_t properties_len)
{
    return (uint64_t)HDR + client_id_len + topic_len
           + (properties_len ? EB_PROPERTIES_LENGTH_SIZE + (uint64_t)properties_len : 0);
}

int64_t eb_append_record(eb_appender *a, int64_t timestamp_ms, int qos, int retain,
                         const char *client_id, size_t client_id_len,
                         const char *topic, size_t topic_len,
                         const char *payload, size_t payload_len,
                         const char *properties, size_t properties_len)
{
    uint64_t length = record_prefix(client_id_len, topic_len, properties_len) + payload_len;
    uint8_t *out;
    if (payload_len >= a->big_payload)
        return -1;
    out = begin_record(a, timestamp_ms, qos, retain, client_id, client_id_len, topic, topic_len,
                       payload, payload_len, properties, properties_len, length, length);
    if (out == NULL)
        return -1;
    memcpy(out + length - payload_len, payload, payload_len);
    return staged(a, timestamp_ms, length, length);
}

int64_t eb_append_held(eb_appender *a, int64_t timestamp_ms, int qos, int retain,
                       const char *client_id, size_t client_id_len,
                       const char *topic, size_t topic_len,
                       const char *payload, size_t payload_len,
                       const char *properties, size_t properties_len)
{
    uint64_t prefix = record_prefix(client_id_len, topic_len, properties_len);
    uint64_t length = prefix + payload_len;
    if (payload_len > MAX_PAYLOAD || a->held_count >= a->held_capacity
        || begin_record(a, timestamp_ms, qos, retain, client_id, client_id_len, topic, topic_len,
                        payload, payload_len, properties, properties_len, prefix, length) == NULL)
        return -1;
    a->held[a->held_count++] = a->used + prefix;
    return staged(a, timestamp_ms, prefix, length);
}

/* The checks on a record header that need no CRC: its length fields agree, the attribute byte
 * uses only the QoS (not 3), retain and (format version 2) properties bits, the reserved byte is
 * zero, and the offset is at least min_offset, less than min_offset + 2^32 and below 2^64 - 1.
 * A record with properties has its length R after the header: here only room for R >= 1 (the bit is set
 * only when there are properties) is checked, props_ok checks R once the record is whole. Returns the record length, or 0 when implausible. */
static uint64_t plausible(const uint8_t *p, uint64_t min_offset, int version)
{
    uint32_t length = ld32(p + 4);
    uint64_t offset = ld64(p + 8);
    uint8_t attrs = p[24];
    uint64_t fields = (uint64_t)HDR + ld16(p + 26) + ld16(p + 28) + ld32(p + 30);
    if (length < HDR || (uint64_t)length > MAX_RECORD)
        return 0;
    if (attrs & PROPS) {
        if (version < 2 || fields + EB_PROPERTIES_LENGTH_SIZE >= length)
            return 0;
    } else if (fields != length)
        return 0;
    if ((attrs & 0xF0) || (attrs & 3) == 3 || p[25])
        return 0;
    if (offset < min_offset || offset - min_offset > 0xFFFFFFFFu || offset == UINT64_MAX)
        return 0;   /* (the last: the next record's offset, offset + 1, would wrap to 0) */
    return length;
}

/* A whole record of `length` bytes at p that passed plausible(): its properties length R, when
 * it has properties, is what the other lengths leave of the record. */
static int props_ok(const uint8_t *p, uint64_t length)
{
    return !(p[24] & PROPS) || (uint64_t)ld32(p + HDR) == length - HDR - EB_PROPERTIES_LENGTH_SIZE
           - ld16(p + 26) - ld16(p + 28) - ld32(p + 30);
}

static int crc_ok(const uint8_t *p, uint32_t length)
{
    return ~crc_update(0xFFFFFFFFu, p + 4, length - 4) == ld32(p);
}

/* Topic filter matching, MQTT 3.1.1 section 4.7: `+` matches one level, `#` this level and
 * every level below (and the parent: "a/#" matches "a"), a filter starting with a wildcard does
 * not match a topic starting with `$`. Level by level, exactly like mqtt.topics.topic_matches
 * (also for invalid filters, so that the pure twin can be that function's algorithm). */
int eb_topic_matches(const uint8_t *f, size_t flen, const uint8_t *t, size_t tlen)
{
    size_t fs = 0, ts = 0;
    int topic_done = 0;
    if (!memchr(f, '+', flen) && !memchr(f, '#', flen))
        return flen == tlen && memcmp(f, t, flen) == 0;
    if (tlen && t[0] == '$' && (f[0] == '+' || f[0] == '#'))
        return 0;
    for (;;) {
        const uint8_t *slash = memchr(f + fs, '/', flen - fs);
        size_t fe = slash ? (size_t)(slash - f) : flen;
        size_t te;
        if (fe - fs == 1 && f[fs] == '#')
            return 1;
        if (topic_done)
            return 0;
        slash = memchr(t + ts, '/', tlen - ts);
        te = slash ? (size_t)(slash - t) : tlen;
        if (!(fe - fs == 1 && f[fs] == '+') &&
            (fe - fs != te - ts || memcmp(f + fs, t + ts, fe - fs) != 0))
            return 0;
        if (fe == flen)
            return te == tlen;
        fs = fe + 1;
        if (te == tlen)
            topic_done = 1;
        else
            ts = te + 1;
    }
}

/* One step of a scan: classify the bytes at buf[pos]. Returns EB_SCAN_END when a valid record of
 * *length bytes starts there, else EB_SCAN_PARTIAL (with *need) or EB_SCAN_BAD. */
static int step(const uint8_t *buf, size_t buf_len, uint64_t avail, size_t pos, uint64_t min_offset,
                int version, uint32_t *length, uint64_t *need)
{
    uint64_t left = avail - pos;
    uint64_t len;
    if (buf_len - pos < HDR) {
        if (left < HDR)
            return EB_SCAN_BAD;
        *need = HDR;
        return EB_SCAN_PARTIAL;
    }
    len = plausible(buf + pos, min_offset, version);
    if (!len || len > left)
        return EB_SCAN_BAD;
    if (len > buf_len - pos) {
        *need = len;
        return EB_SCAN_PARTIAL;
    }
    if (!props_ok(buf + pos, len) || !crc_ok(buf + pos, (uint32_t)len))
        return EB_SCAN_BAD;
    *length = (uint32_t)len;
    return EB_SCAN_END;
}

int eb_scan(const uint8_t *buf, size_t buf_len, uint64_t avail, uint64_t base_position,
            uint64_t min_offset, int version, const uint8_t *filter, size_t filter_len, int use_filter,
            uint64_t *out, size_t max_out, eb_scan_result *res)
{
    size_t pos = 0;
    uint64_t count = 0, matched = 0, max_ts = res->max_timestamp, need = 0;
    int status;
    if (avail < buf_len)
        buf_len = (size_t)avail;
    for (;;) {
        uint32_t length = 0;
        const uint8_t *p;
        if (pos == avail) {
            status = EB_SCAN_END;
            break;
        }
        status = step(buf, buf_len, avail, pos, min_offset, version, &length, &need);
        if (status != EB_SCAN_END)
            break;
        p = buf + pos;
        if (!use_filter || eb_topic_matches(filter, filter_len,
                                            p + HDR + (p[24] & PROPS ? EB_PROPERTIES_LENGTH_SIZE : 0)
                                            + ld16(p + 26), ld16(p + 28))) {
            uint64_t *e;
            if (matched == max_out) {
                status = EB_SCAN_FULL;
                break;
            }
            e = out + matched * EB_SCAN_ENTRY_WORDS;
            e[0] = ld64(p + 8);
            e[1] = ld64(p + 16);
            e[2] = base_position + pos;
            e[3] = length;
            e[4] = (uint64_t)p[24] | ((uint64_t)ld16(p + 26) << 8) | ((uint64_t)ld16(p + 28) << 24);
            matched++;
        }
        count++;
        min_offset = ld64(p + 8) + 1;
        if (ld64(p + 16) > max_ts)
            max_ts = ld64(p + 16);
        pos += length;
    }
    res->stop = pos;
    res->need = status == EB_SCAN_PARTIAL ? need : 0;
    res->count = count;
    res->matched = matched;
    res->next_offset = min_offset;
    res->max_timestamp = max_ts;
    res->status = status;
    return status;
}

int eb_build_index(const uint8_t *buf, size_t buf_len, uint64_t avail, uint64_t base_position,
                   uint64_t base_offset, uint64_t min_offset, int version, uint64_t max_timestamp,
                   uint8_t *out, size_t max_entries, eb_scan_result *res)
{
    size_t pos = 0;
    uint64_t count = 0, need = 0;
    int status;
    if (avail < buf_len)
        buf_len = (size_t)avail;
    if (min_offset < base_offset)
        min_offset = base_offset;
    for (;;) {
        uint32_t length = 0;
        const uint8_t *p;
        uint8_t *e;
        if (pos == avail) {
            status = EB_SCAN_END;
            break;
        }
        if (count == max_entries) {
            status = EB_SCAN_FULL;
            break;
        }
        status = step(buf, buf_len, avail, pos, min_offset, version, &length, &need);
        if (status != EB_SCAN_END)
            break;
        p = buf + pos;
        if (ld64(p + 8) - base_offset > 0xFFFFFFFFu || base_position + pos > 0xFFFFFFFFu) {
            status = EB_SCAN_BAD;  /* cannot be described by a 32-bit index entry */
            break;
        }
        if (ld64(p + 16) > max_timestamp)
            max_timestamp = ld64(p + 16);
        e = out + count * EB_INDEX_ENTRY_SIZE;
        st32(e, (uint32_t)(ld64(p + 8) - base_offset));
        st32(e + 4, (uint32_t)(base_position + pos));
        st64(e + 8, max_timestamp);
        count++;
        min_offset = ld64(p + 8) + 1;
        pos += length;
    }
    res->stop = pos;
    res->need = status == EB_SCAN_PARTIAL ? need : 0;
    res->count = count;
    res->matched = count;
    res->next_offset = min_offset;
    res->max_timestamp = max_timestamp;
    res->status = status;
    return status;
}

int eb_resync(const uint8_t *buf, size_t buf_len, uint64_t avail, size_t start,
              uint64_t min_offset, int version, uint64_t *position, uint64_t *need)
{
    if (avail < buf_len)
        buf_len = (size_t)avail;
    for (size_t p = start; p + HDR <= buf_len; p++) {
        uint64_t len = plausible(buf + p, min_offset, version);
        if (!len || len > avail - p)
            continue;
        if (len > buf_len - p) {
            *position = p;
            *need = len;
            return EB_RESYNC_CANDIDATE;
        }
        if (props_ok(buf + p, len) && crc_ok(buf + p, (uint32_t)len)) {
            *position = p;
            *need = 0;
            return EB_RESYNC_FOUND;
        }
    }
    *position = 0;
    *need = 0;
    return EB_RESYNC_NONE;
}

/* ------------------------------------------------------------------------------------------ */
/* Index: 16-byte entries (relative offset u32, position u32, running max timestamp u64),      */
/* both keys non-decreasing. Lower-bound binary searches: the first entry >= the key, or count. */

/* How many leading entries are consistent: relative offsets and positions strictly increasing,
 * positions at or after the segment header and before segment_size, timestamps non-decreasing.
 * *nonzero: entries before the first all-zero one (the unused, preallocated tail of the index
 * of the segment being written). A healthy index has result == *nonzero. */
size_t eb_index_check(const uint8_t *index, size_t count, uint64_t segment_size, size_t *nonzero)
{
    size_t i, valid = 0, nz = 0;
    int still_valid = 1;
    uint32_t prev_rel = 0, prev_pos = 0;
    uint64_t prev_ts = 0;
    for (i = 0; i < count; i++) {
        const uint8_t *e = index + i * EB_INDEX_ENTRY_SIZE;
        uint32_t rel = ld32(e), pos = ld32(e + 4);
        uint64_t ts = ld64(e + 8);
        if (!rel && !pos && !ts)
            break;
        nz++;
        if (still_valid) {
            if (pos < EB_SEGMENT_HEADER_SIZE || pos >= segment_size ||
                (i > 0 && (rel <= prev_rel || pos <= prev_pos || ts < prev_ts)))
                still_valid = 0;
            else
                valid++;
        }
        prev_rel = rel;
        prev_pos = pos;
        prev_ts = ts;
    }
    *nonzero = nz;
    return valid;
}

int64_t eb_index_find_offset(const uint8_t *index, size_t count, uint32_t relative_offset)
{
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ld32(index + mid * EB_INDEX_ENTRY_SIZE) < relative_offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (int64_t)lo;
}

int64_t eb_index_find_time(const uint8_t *index, size_t count, uint64_t timestamp_ms)
{
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ld64(index + mid * EB_INDEX_ENTRY_SIZE + 8) < timestamp_ms)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (int64_t)lo;
}

/* ------------------------------------------------------------------------------------------ */
/* PUBLISH frames for records a session catching up reads from the log (core/catchup.py)        */

int64_t eb_publish_frames(const uint8_t *buf, size_t buf_len, uint64_t base_position,
                          const uint64_t *entries, size_t n, const uint8_t *qos,
                          const uint16_t *pids, uint8_t *out, size_t out_cap)
{
    size_t used = 0, i;
    for (i = 0; i < n; i++) {
        const uint64_t *e = entries + i * EB_SCAN_ENTRY_WORDS;
        uint64_t at = e[2] - base_position, length = e[3];
        uint64_t cid_len = e[4] >> 8 & 0xFFFF, topic_len = e[4] >> 24 & 0xFFFF;
        uint64_t payload_len, remaining;
        unsigned q = qos[i];
        const uint8_t *topic;
        uint8_t *o;
        if (q == 255)
            continue;
        if (q > 2 || e[2] < base_position || at > buf_len || length > buf_len - at
            || length < HDR + cid_len + topic_len)
            return -1;
        payload_len = length - HDR - cid_len - topic_len;
        remaining = 2 + topic_len + (q ? 2 : 0) + payload_len;
        if (remaining > 268435455u || out_cap - used < 5 + remaining)
            return -1;
        topic = buf + at + HDR + cid_len;
        o = out + used;
        *o++ = (uint8_t)(0x30 | q << 1);
        do {
            uint8_t byte = remaining & 0x7F;
            remaining >>= 7;
            *o++ = remaining ? byte | 0x80 : byte;
        } while (remaining);
        *o++ = (uint8_t)(topic_len >> 8);
        *o++ = (uint8_t)topic_len;
        memcpy(o, topic, topic_len);
        o += topic_len;
        if (q) {
            *o++ = (uint8_t)(pids[i] >> 8);
            *o++ = (uint8_t)pids[i];
        }
        memcpy(o, topic + topic_len, payload_len);
        o += payload_len;
        used = (size_t)(o - out);
    }
    return (int64_t)used;
}

/* ------------------------------------------------------------------------------------------ */
/* Send batch: for each item, its header bytes with send(MSG_MORE), then its file range with   */
/* sendfile, to one non-blocking socket. Stops at EAGAIN or an error and says where.            */

int eb_send_batch(int sock, const eb_send_item *items, size_t n, size_t start_item,
                  size_t start_progress, int cork, eb_send_result *res)
{
    uint64_t sent = 0;
    size_t i = start_item, progress = start_progress;
    int err = 0, one = 1, zero = 0;
    if (cork)
        (void)setsockopt(sock, IPPROTO_TCP, TCP_CORK, &one, sizeof one);
    while (i < n) {
        const eb_send_item *it = &items[i];
        if (progress < it->head_len) {
            int flags = MSG_NOSIGNAL | MSG_DONTWAIT;
            ssize_t r;
            if (it->file_len || i + 1 < n)
                flags |= MSG_MORE;
            r = send(sock, it->head + progress, it->head_len - progress, flags);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                err = errno == EWOULDBLOCK ? EAGAIN : errno;
                break;
            }
            sent += (uint64_t)r;
            progress += (size_t)r;
            continue;
        }
        if (progress < it->head_len + it->file_len) {
            size_t done = progress - it->head_len;
            off_t off = (off_t)(it->file_pos + (int64_t)done);
            ssize_t r = sendfile(sock, it->fd, &off, it->file_len - done);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                err = errno == EWOULDBLOCK ? EAGAIN : errno;
                break;
            }
            if (r == 0) {
                err = ENODATA;  /* the file is shorter than the range asked for */
                break;
            }
            sent += (uint64_t)r;
            progress += (size_t)r;
            continue;
        }
        i++;
        progress = 0;
    }
    if (cork)
        (void)setsockopt(sock, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
    res->sent = sent;
    res->item = i;
    res->progress = progress;
    res->error = err;
    return err;
}

/* ------------------------------------------------------------------------------------------ */
/* Allocating a segment file's blocks ahead                                                      */

int eb_fallocate_keep_size(int fd, int64_t length) {
#ifdef FALLOC_FL_KEEP_SIZE
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, length) == 0)
        return 0;
    return errno ? errno : EIO;
#else
    return ENOSYS;
#endif
}

int eb_keep_freed_memory(int64_t trim_threshold, int64_t mmap_threshold) {
#ifdef __GLIBC__
    if (trim_threshold < 0 || trim_threshold > INT_MAX || mmap_threshold < 0
            || mmap_threshold > INT_MAX)
        return EINVAL;
    if (!mallopt(M_TRIM_THRESHOLD, (int)trim_threshold)
            || !mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold))
        return EINVAL;
    return 0;
#else
    (void)trim_threshold;
    (void)mmap_threshold;
    return ENOSYS;
#endif
}

int eb_release_freed_memory(void) {
#ifdef __GLIBC__
    malloc_trim(0);
    return 0;
#else
    return ENOSYS;
#endif
}
