#ifndef PROTECTEDSTORE_CSODIUM_SHIM_H
#define PROTECTEDSTORE_CSODIUM_SHIM_H
#include <sodium.h>

// AEGIS-256 came with libsodium 1.0.19; Debian 12 ships 1.0.18. These wrappers let the same Swift code build against
// either: without it they report it unavailable and fail every call. Its key and nonce are 32 bytes in every version.
#ifdef crypto_aead_aegis256_ABYTES
#define PS_AEGIS256_TAGBYTES crypto_aead_aegis256_ABYTES
static inline int ps_aegis256_is_available(void) { return 1; }
static inline int ps_aegis256_encrypt(unsigned char *c, const unsigned char *m, unsigned long long mlen,
                                      const unsigned char *ad, unsigned long long adlen,
                                      const unsigned char *npub, const unsigned char *k) {
    return crypto_aead_aegis256_encrypt(c, NULL, m, mlen, ad, adlen, NULL, npub, k);
}
static inline int ps_aegis256_decrypt(unsigned char *m, const unsigned char *c, unsigned long long clen,
                                      const unsigned char *ad, unsigned long long adlen,
                                      const unsigned char *npub, const unsigned char *k) {
    return crypto_aead_aegis256_decrypt(m, NULL, NULL, c, clen, ad, adlen, npub, k);
}
#else
#define PS_AEGIS256_TAGBYTES 32U
static inline int ps_aegis256_is_available(void) { return 0; }
static inline int ps_aegis256_encrypt(unsigned char *c, const unsigned char *m, unsigned long long mlen,
                                      const unsigned char *ad, unsigned long long adlen,
                                      const unsigned char *npub, const unsigned char *k) {
    (void)c; (void)m; (void)mlen; (void)ad; (void)adlen; (void)npub; (void)k;
    return -1;
}
static inline int ps_aegis256_decrypt(unsigned char *m, const unsigned char *c, unsigned long long clen,
                                      const unsigned char *ad, unsigned long long adlen,
                                      const unsigned char *npub, const unsigned char *k) {
    (void)m; (void)c; (void)clen; (void)ad; (void)adlen; (void)npub; (void)k;
    return -1;
}
#endif
#endif
