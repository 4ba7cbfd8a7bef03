/*
 * The safetensors container (https://github.com/huggingface/safetensors, "Format"): an 8-byte
 * little-endian header size N, N bytes of JSON ({"<tensor>": {"dtype", "shape", "data_offsets"}, ...,
 * "__metadata__": {string: string}}), then the tensors' bytes, back to back, row-major, little-endian.
 * libmoe adds its own metadata (all strings, as the format requires): "libmoe.format", the rank and
 * rank count, the layer config, and per tensor "libmoe.tensor.<name>": its kind, slot, global shape, the
 * view and the box it holds, and the CRC-32 (zlib) of its bytes. Parsing checks everything a reader
 * relies on (no JSON is trusted): this is the fuzzed surface (tests/fuzz/fuzz_checkpoint.c).
 */
#ifndef MOE_CKPT_SAFETENSORS_H
#define MOE_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

#define MOE_ST_MAX_HEADER (64u << 20) /* no header of ours comes near; a larger one is damage */
#define MOE_ST_FORMAT "libmoe-checkpoint-1"

typedef struct moe_st_tensor {
    moe_state_entry e;       /* name, kind, slot, dtype, global shape, view, offset and length (the box) */
    uint64_t begin, end;     /* its bytes in the data section */
    uint32_t crc;            /* CRC-32 of those bytes */
} moe_st_tensor;

typedef struct moe_st_header {
    int32_t rank, ranks;
    char generation[24];
    char *config;            /* the layer config as JSON text (moe_host_malloc'd) */
    moe_st_tensor *t;        /* moe_host_malloc'd */
    int32_t n;
} moe_st_header;

/* The header's bytes for tensors t[0..n) laid out back to back in that order (t[i].begin/end are set
 * here), padded with spaces to a multiple of 8 and preceded by its size: *out (moe_host_malloc'd),
 * *len bytes, *data_bytes the data section's size. */
int32_t moe_st_header_write(moe_st_tensor *t, int32_t n, const moe_st_header *meta, char **out, size_t *len,
                            uint64_t *data_bytes);
/* Parses and checks the JSON of a header (hdr, len bytes) whose data section has data_bytes bytes;
 * MOE_ERR_IO with a reason in msg on anything malformed. h is filled only on success. */
int32_t moe_st_header_parse(const char *hdr, size_t len, uint64_t data_bytes, moe_st_header *h, char *msg,
                            size_t cap);
void moe_st_header_free(moe_st_header *h);
/* Exactly eight hex digits (a CRC-32 as libmoe writes it) into *out; 0 for anything else. */
int moe_st_hex32(const char *s, uint32_t *out);
/* "0.2.0": the library version the files record (moe_version_string's text; that function is on
 * the API floor). */
const char *moe_st_version(void);
/* "F32", "BF16", "F64", "I64" */
const char *moe_st_dtype_name(int32_t dtype);

#endif /* MOE_CKPT_SAFETENSORS_H */
