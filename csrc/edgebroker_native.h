/* edgebroker native helper: the C declarations.
 *
 * This header is read twice: by the C compiler (csrc/edgebroker_native.c includes it after
 * <stdint.h> and <stddef.h>) and by cffi's cdef (edgebroker/_native/_build.py). So it holds
 * only what cdef understands: integer #defines, structs and prototypes. No #include, no #if.
 *
 * Every function here has a pure-Python twin in edgebroker/_native/_pure.py that gives the
 * same results; docs/log-format.md describes the on-disk layout they parse.
 */

#define EB_SEGMENT_HEADER_SIZE 32
#define EB_RECORD_HEADER_SIZE 34
#define EB_INDEX_ENTRY_SIZE 16
#define EB_SCAN_ENTRY_WORDS 5
#define EB_FORMAT_VERSION 2          /* segments this code writes; it reads 1 and 2 */
#define EB_ATTR_PROPERTIES 0x08      /* attributes bit 3 (version 2): a u32 properties length */
#define EB_PROPERTIES_LENGTH_SIZE 4  /* follows the 34-byte header, properties after the topic */

/* scan / build_index status */
#define EB_SCAN_END 0      /* every byte up to `avail` was a valid record */
#define EB_SCAN_PARTIAL 1  /* the record at `stop` continues past the buffer: read `need` bytes from there */
#define EB_SCAN_BAD 2      /* the bytes at `stop` are not a valid record (corrupt or torn) */
#define EB_SCAN_FULL 3     /* the output array is full; call again from `stop` */

/* resync status */
#define EB_RESYNC_NONE 0       /* no valid record starts in the buffer */
#define EB_RESYNC_FOUND 1      /* a valid record starts at `position` */
#define EB_RESYNC_CANDIDATE 2  /* a plausible header at `position`; its record (`need` bytes) ends past the buffer */


typedef struct {
    uint64_t stop;         /* buffer position where the scan stopped */
    uint64_t need;         /* EB_SCAN_PARTIAL: bytes needed from `stop` */
    uint64_t count;        /* valid records passed over */
    uint64_t matched;      /* entries written to the output */
    uint64_t next_offset;  /* one past the offset of the last valid record (or min_offset) */
    uint64_t max_timestamp;/* largest timestamp seen (or the value passed in) */
    int status;
} eb_scan_result;

typedef struct {
    const uint8_t *head;   /* bytes sent first (may be NULL when head_len is 0) */
    size_t head_len;
    int fd;                /* then file_len bytes of this file from file_pos, with sendfile */
    int64_t file_pos;
    size_t file_len;
} eb_send_item;

typedef struct {
    uint64_t sent;      /* bytes sent by this call */
    size_t item;        /* index of the first item not completely sent (n when all were) */
    size_t progress;    /* bytes of that item already sent (head first, then file range) */
    int error;          /* 0 when everything was sent, EAGAIN when the socket is full, else errno */
} eb_send_result;

/* The commit log's staging area for small records (see CommitLog.append): records are built
 * into `buf` with their index entries in `index`, and the log moves them into its write
 * queue once per loop pass. The log sets every field but `used`, `count` and the running
 * ones (`next_offset`, `position`, `max_ts`, `staged_first_ts`), which eb_append_record
 * advances. */
typedef struct {
    uint8_t *buf;             /* staged record bytes */
    uint64_t capacity;        /* size of buf */
    uint64_t used;            /* bytes staged */
    uint8_t *index;           /* their index entries, EB_INDEX_ENTRY_SIZE bytes each */
    uint64_t index_capacity;  /* entries that fit in index */
    uint64_t count;           /* records staged */
    uint64_t next_offset;     /* the offset the next record gets */
    uint64_t base_offset;     /* the segment's first offset */
    uint64_t position;        /* where in the segment the next record starts */
    uint64_t segment_bytes;   /* no record may end past this position: the segment rolls */
    int64_t first_ts;         /* the segment's first timestamp ... */
    int64_t segment_ms;       /* ... no record may be segment_ms or more later: it rolls */
    int64_t max_ts;           /* the segment's running maximum timestamp */
    int64_t staged_first_ts;  /* timestamp of the first staged record */
    uint64_t big_payload;     /* payloads this large are not staged (the log holds them) */
    uint64_t *held;           /* per record of eb_append_held: where in buf its payload goes */
    uint64_t held_capacity;   /* (the end of its staged bytes); room for this many */
    uint64_t held_count;      /* records listed in held */
} eb_appender;

uint32_t eb_crc32c(uint32_t crc, const uint8_t *buf, size_t len);
const char *eb_crc32c_method(void);

/* char pointers here, so that Python bytes pass straight through cffi (the append hot path).
 * Writes 34 bytes, or 38 when there are properties (their length after the fixed header, the
 * properties bit set): returns which. */
size_t eb_record_header(char *out, uint64_t offset, uint64_t timestamp_ms, uint32_t attributes,
                        const char *client_id, size_t client_id_len,
                        const char *topic, size_t topic_len,
                        const char *payload, size_t payload_len,
                        const char *properties, size_t properties_len);

/* Stage one record: its offset, or -1 when it is not taken here (it does not fit, the segment
 * must roll, the payload is big, or a field is out of range) and the log's own path decides. */
int64_t eb_append_record(eb_appender *a, int64_t timestamp_ms, int qos, int retain,
                         const char *client_id, size_t client_id_len,
                         const char *topic, size_t topic_len,
                         const char *payload, size_t payload_len,
                         const char *properties, size_t properties_len);

/* Stage a record whose payload the log holds by reference and writes right after it: the header
 * (its CRC covers the payload too), the client id, the topic and the properties; and list it in
 * `held`. Its offset, or -1 as for eb_append_record (never for the payload's size), or when
 * `held` is full. */
int64_t eb_append_held(eb_appender *a, int64_t timestamp_ms, int qos, int retain,
                       const char *client_id, size_t client_id_len,
                       const char *topic, size_t topic_len,
                       const char *payload, size_t payload_len,
                       const char *properties, size_t properties_len);

int eb_topic_matches(const uint8_t *filter, size_t filter_len, const uint8_t *topic, size_t topic_len);

/* `version`: the segment's format version; records with properties are valid only in 2. */
int eb_scan(const uint8_t *buf, size_t buf_len, uint64_t avail, uint64_t base_position,
            uint64_t min_offset, int version, const uint8_t *filter, size_t filter_len,
            int use_filter, uint64_t *out, size_t max_out, eb_scan_result *res);

int eb_build_index(const uint8_t *buf, size_t buf_len, uint64_t avail, uint64_t base_position,
                   uint64_t base_offset, uint64_t min_offset, int version, uint64_t max_timestamp,
                   uint8_t *out, size_t max_entries, eb_scan_result *res);

int eb_resync(const uint8_t *buf, size_t buf_len, uint64_t avail, size_t start,
              uint64_t min_offset, int version, uint64_t *position, uint64_t *need);

size_t eb_index_check(const uint8_t *index, size_t count, uint64_t segment_size, size_t *nonzero);
int64_t eb_index_find_offset(const uint8_t *index, size_t count, uint32_t relative_offset);
int64_t eb_index_find_time(const uint8_t *index, size_t count, uint64_t timestamp_ms);


/* MQTT PUBLISH frames for `n` scan entries (EB_SCAN_ENTRY_WORDS words each, from eb_scan over
 * `buf`, whose first byte is at file position `base_position`): for entry i, skipped when
 * qos[i] is 255, else a PUBLISH with QoS qos[i] (0, 1 or 2; retain and DUP 0), the record's
 * topic, packet identifier pids[i] (QoS 1 and 2 only) and the record's payload, one after
 * another in `out`. The bytes written, or -1 when an entry does not lie in `buf`, a QoS is
 * not 0 to 2 or 255, or `out` (`out_cap` bytes) is too small: every frame is shorter than its
 * record, so the records' total length always fits. */
int64_t eb_publish_frames(const uint8_t *buf, size_t buf_len, uint64_t base_position,
                          const uint64_t *entries, size_t n, const uint8_t *qos,
                          const uint16_t *pids, uint8_t *out, size_t out_cap);

int eb_send_batch(int sock, const eb_send_item *items, size_t n, size_t start_item,
                  size_t start_progress, int cork, eb_send_result *res);
/* Allocate the blocks of the file's first `length` bytes ahead, keeping its size (Linux
 * fallocate with FALLOC_FL_KEEP_SIZE): 0, or the errno (ENOSYS where there is no fallocate). */
int eb_fallocate_keep_size(int fd, int64_t length);
/* glibc malloc: keep up to trim_threshold bytes of freed heap for reuse instead of giving them
 * back to the kernel, and take allocations below mmap_threshold from the heap. 0, EINVAL when
 * a value is refused, ENOSYS without glibc. */
int eb_keep_freed_memory(int64_t trim_threshold, int64_t mmap_threshold);
/* glibc malloc: give the kernel back every whole page of freed heap, whatever the trim
 * threshold (malloc_trim(0)), once, as after start-up. 0, ENOSYS without glibc. */
int eb_release_freed_memory(void);
