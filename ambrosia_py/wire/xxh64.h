/* XXH64, written from its published description (any seed), and the little-endian loads
 * it and the record reader share. Included by _crecords.c. */
#ifndef AMBROSIA_XXH64_H
#define AMBROSIA_XXH64_H

#include <stddef.h>
#include <stdint.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xround(uint64_t acc, uint64_t lane)
{
    acc += lane * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t xmerge(uint64_t acc, uint64_t v)
{
    acc ^= xround(0, v);
    return acc * P1 + P4;
}

static uint64_t xxh64(const unsigned char *p, size_t len, uint64_t seed)
{
    const unsigned char *end = p + len;
    uint64_t acc;
    if (len >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        const unsigned char *limit = end - 32;
        do {
            v1 = xround(v1, rd64(p));
            v2 = xround(v2, rd64(p + 8));
            v3 = xround(v3, rd64(p + 16));
            v4 = xround(v4, rd64(p + 24));
            p += 32;
        } while (p <= limit);
        acc = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        acc = xmerge(acc, v1);
        acc = xmerge(acc, v2);
        acc = xmerge(acc, v3);
        acc = xmerge(acc, v4);
    }
    else {
        acc = seed + P5;
    }
    acc += (uint64_t)len;
    while (end - p >= 8) {
        acc ^= xround(0, rd64(p));
        acc = rotl64(acc, 27) * P1 + P4;
        p += 8;
    }
    if (end - p >= 4) {
        acc ^= (uint64_t)rd32(p) * P1;
        acc = rotl64(acc, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        acc ^= (uint64_t)(*p) * P5;
        acc = rotl64(acc, 11) * P1;
        p++;
    }
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

#endif
