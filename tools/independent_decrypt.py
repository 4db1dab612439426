#!/usr/bin/env python3
"""Independent decryptor for ProtectedStore: reads encrypted-file format
version 2, encrypted names version 2, container descriptions and the Inbox
queue (keybag and device secret: version 1).

Written only from docs/FORMAT.md, as a check that the specification is
sufficient. Depends on PyNaCl (libsodium bindings), libsodium itself (through
ctypes, for HChaCha20 and AEGIS-256) and the standard library.

Usage:
    python3 tools/independent_decrypt.py --root ROOT --device-secret SECRET_FILE \
        [--out DIR] FILE... < passcode
    python3 tools/independent_decrypt.py --root ROOT --device-secret SECRET_FILE \
        [--out DIR] --container BUNDLE_ID < passcode
    python3 tools/independent_decrypt.py --root ROOT --device-secret SECRET_FILE \
        --list-containers < passcode

The passcode is read as one line from stdin (the line terminator is removed,
nothing else). For each FILE the output is "FILE: OK <size> bytes class <X>",
<size> being the plaintext size L from the file's length record (§4.2).

Containers (§7) live in <ROOT>/containers/<id>/, <id> being derived from the
bundle identifier with the device's name key NK_dev, each with a sealed
description container.sealed (bundle identifier, default class). A checked
description prints
    container <id>: <bundle id>, default class <X>
<X> being the class letter A-D (the stored class name, normalised).

With --container, the description of BUNDLE_ID's container is checked first
(its bundle identifier must be BUNDLE_ID; a missing folder is an error), then
the whole data directory <ROOT>/containers/<id>/Data is decrypted: names,
files and link targets; reserved entries (".sandboxctl…") are skipped. One
line per item, with its decrypted path relative to Data:
    Documents/Projects/: OK directory
    Documents/notes.txt: OK 12 bytes class C
    Documents/link -> Projects/x: OK link
then one line per Inbox queue record (§6), its JSON on one line:
    inbox-queue <sequence>: {...}
With --out, the plaintext tree is recreated under DIR (directories, files,
symbolic links with their decrypted targets, FIFOs). A rejected item is
reported on stderr as "<stored path>: FAILED <reason>" and the rest is still
processed. Control characters in decrypted names and targets are printed as
\\xNN escapes.

With --list-containers, every <ROOT>/containers/* folder (but ".sandboxctl…"
entries) is checked: its description must open for the folder's id and its
bundle identifier must give back that id. One "container" line per good one;
the others are "<path>: FAILED <reason>" on stderr.

Exit status: 0 all files (items, containers) OK, 1 at least one file, name,
link target, queue record or container description rejected, or the
container's folder missing, 2 keybag/device secret/passcode problem (nothing
decrypted).
"""

import argparse
import base64
import ctypes
import ctypes.util
import hashlib
import errno
import hmac
import json
import os
import stat
import struct
import sys
import tempfile

try:
    import nacl.bindings as sodium
    import nacl.exceptions
    import nacl.pwhash
except ImportError:  # pragma: no cover
    sys.exit("error: PyNaCl is required (pip install pynacl)")


class FormatError(Exception):
    """Any verification failure; the message says which check failed."""


# ---------------------------------------------------------------- primitives

def H(m: bytes) -> bytes:
    return hashlib.blake2b(m, digest_size=32).digest()


def HK(k: bytes, m: bytes) -> bytes:
    return hashlib.blake2b(m, digest_size=32, key=k).digest()


def aead_open(key: bytes, nonce: bytes, sealed: bytes, ad: bytes, what: str) -> bytes:
    try:
        return sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(sealed, ad, nonce, key)
    except nacl.exceptions.CryptoError:
        raise FormatError(f"{what}: authentication failed") from None


def libsodium():
    """The system's libsodium through ctypes, for what PyNaCl does not wrap:
    HChaCha20 and AEGIS-256."""
    global _libsodium
    if _libsodium is None:
        name = os.environ.get("PROTECTEDSTORE_LIBSODIUM") or ctypes.util.find_library("sodium")
        if name is None:
            raise FormatError("AES-256-GCM and AEGIS-256 blocks need libsodium through ctypes (apt-get install libsodium23)")
        _libsodium = ctypes.CDLL(name)
        # Picks the CPU's fastest implementations (AEGIS-256's AES-NI one among them).
        if _libsodium.sodium_init() < 0:
            raise FormatError("libsodium failed to initialise")
    return _libsodium


def has_aegis256() -> bool:
    """AEGIS-256 came with libsodium 1.0.19."""
    try:
        return hasattr(libsodium(), "crypto_aead_aegis256_decrypt")
    except (FormatError, OSError):
        return False


def hchacha20(key: bytes, seed: bytes, constants: bytes) -> bytes:
    out = ctypes.create_string_buffer(32)
    if libsodium().crypto_core_hchacha20(out, seed, key, constants) != 0:
        raise FormatError("HChaCha20 failed")
    return out.raw


def aegis256_decrypt(sealed: bytes, ad: bytes, nonce: bytes, key: bytes) -> bytes:
    if not has_aegis256():
        raise FormatError("unsupported format: AEGIS-256 blocks need libsodium 1.0.19 or later "
                          "(set PROTECTEDSTORE_LIBSODIUM to its shared library)")
    out = ctypes.create_string_buffer(max(1, len(sealed) - 32))
    outlen = ctypes.c_ulonglong(0)
    if libsodium().crypto_aead_aegis256_decrypt(out, ctypes.byref(outlen), None, sealed, ctypes.c_ulonglong(len(sealed)),
                                                ad, ctypes.c_ulonglong(len(ad)), nonce, key) != 0:
        raise nacl.exceptions.CryptoError("AEGIS-256 authentication failed")
    return out.raw[:outlen.value]


_libsodium = None


def block_overhead(cipher: int) -> int:
    """§4.3: the 24-byte nonce field, then a 16-byte tag, or 32 for AEGIS-256."""
    return 24 + (32 if cipher == CIPHER_AEGIS256 else 16)


def open_block(cipher: int, fk: bytes, blk: bytes, ad: bytes) -> bytes:
    """§4.3: a block is nonce field (24) || ciphertext || tag. Cipher 1:
    XChaCha20-Poly1305 under FK with the field as nonce. Cipher 2: AES-256-GCM
    under HChaCha20(FK, field[0:16], constants "PSEF AES-GCM key") with nonce
    field[12:24]. Cipher 3: AEGIS-256 under HChaCha20(FK, 16 zero bytes,
    constants "PSEF AEGIS-256 k") with nonce field || 8 zero bytes."""
    if cipher == CIPHER_XCHACHA20POLY1305:
        return sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(blk[24:], ad, blk[:24], fk)
    if cipher == CIPHER_AES256GCM:
        block_key = hchacha20(fk, blk[:16], b"PSEF AES-GCM key")
        return sodium.crypto_aead_aes256gcm_decrypt(blk[24:], ad, blk[12:24], block_key)
    aegis_key = hchacha20(fk, bytes(16), b"PSEF AEGIS-256 k")
    return aegis256_decrypt(blk[24:], ad, blk[:24] + bytes(8), aegis_key)


def unwrap(key: bytes, wrapped: bytes, ad: bytes, what: str) -> bytes:
    """A wrapped key is nonce (24) || AEAD(k, nonce, key32, ad) (48)."""
    assert len(wrapped) == 72
    out = aead_open(key, wrapped[:24], wrapped[24:], ad, what)
    if len(out) != 32:
        raise FormatError(f"{what}: unwrapped key is not 32 bytes")
    return out


def x25519(s: bytes, p: bytes) -> bytes:
    try:
        out = sodium.crypto_scalarmult(s, p)
    except nacl.exceptions.RuntimeError:  # libsodium returns -1 on all-zero output
        raise FormatError("X25519 produced an all-zero shared secret") from None
    if out == bytes(32):
        raise FormatError("X25519 produced an all-zero shared secret")
    return out


def u16(b, o): return struct.unpack_from("<H", b, o)[0]
def u32(b, o): return struct.unpack_from("<I", b, o)[0]
def u64(b, o): return struct.unpack_from("<Q", b, o)[0]


CLASS_LETTERS = {1: "A", 2: "B", 3: "C", 4: "D"}

# ------------------------------------------------------ device secret (§2)

DEVSEC_SIZE = 64


def read_device_secret(path: str):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != DEVSEC_SIZE:
        raise FormatError(f"device secret: size {len(data)}, expected {DEVSEC_SIZE}")
    if data[0:8] != b"PSDEVSEC":
        raise FormatError("device secret: bad magic")
    if u16(data, 8) != 1:
        raise FormatError(f"device secret: unsupported version {u16(data, 8)}")
    if data[10:16] != bytes(6):
        raise FormatError("device secret: reserved bytes not zero")
    return data[16:32], data[32:64]  # (keybag id, DS)


# -------------------------------------------------------------- keybag (§3)

KEYBAG_SIZE = 424
ENTRY_OFFSETS = (96, 170, 244, 318)
WRAP_PASSCODE, WRAP_DEVICE = 1, 2
EXPECTED_WRAPPING = {1: WRAP_PASSCODE, 2: WRAP_PASSCODE, 3: WRAP_PASSCODE, 4: WRAP_DEVICE}


def read_binding(path: str, kbid: bytes, ds: bytes, kb: bytes):
    """§3.1: the binding value for keybag bytes kb, or None when there is no binding file."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 32 or data[0:8] != b"PSPCBIND" or u16(data, 8) != 1:
        raise FormatError("passcode binding: bad magic or version")
    count = data[10]
    if count not in (1, 2) or data[11:16] != bytes(5) or len(data) != 32 + 64 * count + 32:
        raise FormatError("passcode binding: bad count, reserved bytes or size")
    if data[16:32] != kbid:
        raise FormatError("passcode binding: belongs to another keybag")
    k_bind = HK(ds, b"ProtectedStore v1 passcode binding mac" + kbid)
    if not hmac.compare_digest(HK(k_bind, data[:-32]), data[-32:]):
        raise FormatError("passcode binding: MAC mismatch")
    digest = H(kb)
    for i in range(count):
        entry = data[32 + 64 * i:32 + 64 * (i + 1)]
        if hmac.compare_digest(entry[32:], digest):
            return entry[:32]
    raise FormatError("keybag: not the one the passcode binding names (rolled back or replaced)")


def open_keybag(path: str, ds_kbid: bytes, ds: bytes, passcode: bytes, binding_path: str):
    """Returns (KBID, {class id: class key}, PK_B). Class 2's key is SK_B."""
    with open(path, "rb") as f:
        kb = f.read()
    if len(kb) != KEYBAG_SIZE:
        raise FormatError(f"keybag: size {len(kb)}, expected {KEYBAG_SIZE}")
    if kb[0:8] != b"PSKEYBAG":
        raise FormatError("keybag: bad magic")
    if u16(kb, 8) != 1:
        raise FormatError(f"keybag: unsupported version {u16(kb, 8)}")
    flags = u16(kb, 10)
    if flags & ~1:
        raise FormatError(f"keybag: unknown flags {flags:#x}")
    kbid = kb[12:28]
    if kbid != ds_kbid:
        raise FormatError("device secret belongs to another keybag (keybag id mismatch)")

    # MAC first, constant time: a mismatch is tampering or a foreign device
    # secret, never a wrong passcode.
    k_dev = HK(ds, b"ProtectedStore v1 device key" + kbid)
    k_mac = HK(ds, b"ProtectedStore v1 keybag mac" + kbid)
    if not hmac.compare_digest(HK(k_mac, kb[0:392]), kb[392:424]):
        raise FormatError("keybag: MAC mismatch (keybag modified, or wrong device secret)")

    if kb[28] != 2:
        raise FormatError(f"keybag: unsupported KDF algorithm {kb[28]}")
    if kb[29:32] != bytes(3):
        raise FormatError("keybag: reserved bytes not zero")
    ops, mem, salt = u64(kb, 32), u64(kb, 40), kb[48:64]
    ops_min, ops_max = sodium.crypto_pwhash_argon2id_OPSLIMIT_MIN, 4 * sodium.crypto_pwhash_argon2id_OPSLIMIT_SENSITIVE
    mem_min, mem_max = sodium.crypto_pwhash_argon2id_MEMLIMIT_MIN, 4 * sodium.crypto_pwhash_argon2id_MEMLIMIT_SENSITIVE
    if not ops_min <= ops <= ops_max:
        raise FormatError(f"keybag: Argon2id ops limit {ops} outside [{ops_min}, {ops_max}]")
    if not mem_min <= mem <= mem_max:
        raise FormatError(f"keybag: Argon2id memory limit {mem} outside [{mem_min}, {mem_max}]")
    pk_b = kb[64:96]

    # Parse and sanity-check all entries before spending time on Argon2id.
    entries = []
    for slot, off in enumerate(ENTRY_OFFSETS):
        cid, wrapping, wrapped = kb[off], kb[off + 1], kb[off + 2:off + 74]
        if cid != slot + 1:
            raise FormatError(f"keybag: entry {slot} has class id {cid}, expected {slot + 1}")
        if wrapping != EXPECTED_WRAPPING[cid]:
            raise FormatError(f"keybag: entry {slot} has wrapping {wrapping}")
        entries.append((cid, wrapping, wrapped))

    value = read_binding(binding_path, kbid, ds, kb)
    if flags & 1 and value is None:
        raise FormatError("keybag: bound to a passcode binding, but there is none")
    p = nacl.pwhash.argon2id.kdf(32, passcode, salt, opslimit=ops, memlimit=mem)
    k_pass = HK(ds, b"ProtectedStore v1 passcode key" + kbid + p + (value if flags & 1 else b""))

    keys = {}
    for cid, wrapping, wrapped in entries:
        ad = kbid + bytes([cid, wrapping])
        key = k_pass if wrapping == WRAP_PASSCODE else k_dev
        try:
            keys[cid] = unwrap(key, wrapped, ad, f"keybag entry class {CLASS_LETTERS[cid]}")
        except FormatError:
            if cid == 1:
                raise FormatError("wrong passcode") from None
            raise
    if x25519(keys[2], (9).to_bytes(32, "little")) != pk_b:
        raise FormatError("keybag: class B secret scalar does not match PK_B")
    return kbid, keys, pk_b


# ------------------------------------------------------ encrypted file (§4)

SECTOR = 512
HEADER_SIZE = 512          # §4.1: header sector, bytes 0..<512
RECORD_OFFSET = 512        # §4.2: length-record sector, bytes 512..<1024
BODY_OFFSET = 1024         # §4.3: block 0
FILE_VERSION = 2
CIPHER_XCHACHA20POLY1305 = 1
CIPHER_AES256GCM = 2
CIPHER_AEGIS256 = 3
FLAG_AWAITS_DEFAULT_CLASS = 0x01
MAX_STALE_TAILS = 16


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def lmax(B: int, cipher: int) -> int:
    """§4.4: Lmax = (floor((2^63 - 1 - 1024) / (BS + 24 + T)) - 1) * BS, T the cipher's tag size."""
    return ((2**63 - 1 - BODY_OFFSET) // (B + block_overhead(cipher)) - 1) * B


def check_header(hdr: bytes):
    """§4.1 / §4.5 step 1 (keyless). Returns (class id, BS); the cipher id is hdr[8]."""
    if hdr[0:4] != b"PSEF":
        raise FormatError("bad magic")
    if u16(hdr, 4) != FILE_VERSION:
        raise FormatError(f"unsupported version {u16(hdr, 4)}")
    cid = hdr[6]
    if cid not in CLASS_LETTERS:
        raise FormatError(f"bad protection class id {cid}")
    flags = hdr[7]
    if flags & ~FLAG_AWAITS_DEFAULT_CLASS:
        raise FormatError(f"unknown header flags {flags:#04x}")
    if flags & FLAG_AWAITS_DEFAULT_CLASS and cid != 2:
        raise FormatError("'awaits its default class' flag set on a class other than B")
    if hdr[8] not in (CIPHER_XCHACHA20POLY1305, CIPHER_AES256GCM, CIPHER_AEGIS256):
        raise FormatError(f"unsupported format: cipher id {hdr[8]}")
    if hdr[9:12] != bytes(3):
        raise FormatError("reserved header bytes 9..<12 not zero")
    if hdr[152:512] != bytes(360):
        raise FormatError("header padding bytes 152..<512 not zero")
    B = u32(hdr, 12)
    if not (512 <= B <= 1048576 and B & (B - 1) == 0):
        raise FormatError(f"bad block size {B}")
    return cid, B


def check_record_keyless(rec: bytes, B: int, cipher: int):
    """§4.2 checks that need no key. Returns (L, X, S, {block: valid bytes})."""
    if H(rec[0:264]) != rec[264:296]:
        raise FormatError("length record: checksum mismatch")
    if rec[0:4] != b"PSLR":
        raise FormatError("length record: bad magic")
    n = rec[4]
    if rec[5:8] != bytes(3):
        raise FormatError("length record: reserved bytes not zero")
    if n > MAX_STALE_TAILS:
        raise FormatError(f"length record: {n} stale tails (at most {MAX_STALE_TAILS})")
    if rec[32 + 12 * n:224] != bytes(12 * (MAX_STALE_TAILS - n)):
        raise FormatError("length record: unused stale-tail entries not zero")
    L, X, S = u64(rec, 8), u64(rec, 16), u64(rec, 24)
    lm = lmax(B, cipher)
    if L > lm:
        raise FormatError(f"length record: size {L} exceeds the largest size {lm}")
    if X > ceil_div(L, B):
        raise FormatError(f"length record: extent {X} exceeds ceil(L / BS) = {ceil_div(L, B)}")
    if S > X:
        raise FormatError(f"length record: synced extent {S} exceeds the extent {X}")
    tails = {}
    for k in range(n):
        blk, valid = u64(rec, 32 + 12 * k), u32(rec, 40 + 12 * k)
        if blk >= X:
            raise FormatError(f"length record: stale tail {k} names block {blk}, not below the extent {X}")
        if valid >= B:
            raise FormatError(f"length record: stale tail {k} has {valid} valid bytes (BS is {B})")
        if blk in tails:
            raise FormatError(f"length record: stale tail {k} names block {blk} again")
        tails[blk] = valid
    if rec[296:512] != bytes(216):
        raise FormatError("length record: bytes 296..<512 not zero")
    return L, X, S, tails


def check_record_tag(rec: bytes, fk: bytes, fid: bytes):
    """§4.2: tag = AEAD(FK, nonce, empty, FID || sector bytes 0..<224)."""
    out = aead_open(fk, rec[224:248], rec[248:264], fid + rec[0:224], "length record tag")
    if out != b"":
        raise FormatError("length record: tag opened to a non-empty plaintext")


def decrypt_file(path: str, kbid: bytes, keys: dict, pk_b: bytes, sink=None):
    """§4.5. Returns (class letter, plaintext size L). Raises FormatError on any
    failure. Every block in the extent is authenticated; if `sink` (a binary
    file opened for writing, empty) is given, the plaintext is written to it
    (blocks that read as zeros are left as sparse gaps, the size set at the
    end). The caller must discard `sink` if this raises."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(BODY_OFFSET)
        if len(head) < HEADER_SIZE:
            raise FormatError(f"file too short for a header ({size} bytes)")
        hdr = head[:HEADER_SIZE]

        # 1. Header, keyless.
        cid, B = check_header(hdr)
        # 2. Keybag id.
        if hdr[16:32] != kbid:
            raise FormatError("file was written by another device (keybag id mismatch)")
        fid, eph = hdr[32:48], hdr[48:80]
        # 3. FK.
        if cid == 2:
            shared = x25519(keys[2], eph)
            wrap_key = H(b"ProtectedStore v1 class B wrap" + eph + pk_b + shared)
        else:
            if eph != bytes(32):
                raise FormatError("ephemeral key field not zero for a non-B class")
            wrap_key = keys[cid]
        fk = unwrap(wrap_key, hdr[80:152], hdr[0:80], "header (per-file key)")

        # 4. Length record (keyless checks, then the tag) and the file length.
        if len(head) < BODY_OFFSET:
            raise FormatError(f"file too short for a length record ({size} bytes)")
        rec = head[RECORD_OFFSET:BODY_OFFSET]
        L, X, S, tails = check_record_keyless(rec, B, hdr[8])
        check_record_tag(rec, fk, fid)
        SB = B + block_overhead(hdr[8])
        synced = min(S, X)
        if size < BODY_OFFSET + synced * SB:
            raise FormatError(f"file was cut: {size} bytes, the synced extent needs "
                              f"{BODY_OFFSET + synced * SB}")

        # 5. Blocks (§4.3). Blocks i >= X read as zeros (rule 1): nothing to
        # read or write for them; X <= ceil(L / BS) was checked.
        for i in range(X):
            off = BODY_OFFSET + i * SB
            if off + SB > size:  # rule 2: not wholly in the file
                if i < synced:  # cannot happen after the check above
                    raise FormatError(f"block {i}: file was cut inside the synced extent")
                continue  # lost unsynced block: zeros
            f.seek(off)
            blk = f.read(SB)
            if len(blk) != SB:
                raise FormatError(f"block {i}: short read")
            ad = fid + struct.pack("<Q", i)
            try:
                pt = open_block(hdr[8], fk, blk, ad)
            except nacl.exceptions.CryptoError:
                if blk == bytes(SB):
                    continue  # rule 3: a hole, zeros
                raise FormatError(f"block {i}: authentication failed") from None
            if len(pt) != B:  # cannot happen: the stored block is BS + overhead bytes
                raise FormatError(f"block {i}: plaintext is {len(pt)} bytes, expected {B}")
            if i in tails:  # rule 4: stale tail
                v = tails[i]
                pt = pt[:v] + bytes(B - v)
            if sink is not None:
                want = min(B, L - i * B)  # plaintext byte p < L only
                sink.seek(i * B)
                sink.write(pt[:want])
    if sink is not None:
        sink.truncate(L)
    return CLASS_LETTERS[cid], L


# ------------------------------------------------------------ names (§7)

RESERVED_PREFIX = b".sandboxctl"        # ProtectedStore's own entries, stored as they are
DIRIV_NAME = b".sandboxctl-diriv"
DIRIV_SIZE = 16
LONG_NAME_FILE_PREFIX = b".sandboxctl-name-"
LONG_NAME_MARK = b"~"                   # base64url has no "~": never a stored name
NAME_MAX = 255                          # bytes of UTF-8 in a plaintext name
SHORT_NAME_MAX = 144                    # longest name whose stored form fits in 255 characters
NONCE_SIZE = 24
TAG_SIZE = 16
NAME_PAD = 16
MIN_STORED_NAME = NONCE_SIZE + NAME_PAD + TAG_SIZE   # 56: a name is at least one padded block
B64URL_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def name_subkeys(nk: bytes):
    """§7 Keys: (K_siv, K_name) of a name key."""
    return HK(nk, b"ProtectedStore v2 name siv"), HK(nk, b"ProtectedStore v2 name encryption")


def container_name_keys(ds: bytes, kbid: bytes, bundle_id: str):
    """§7 Keys. Returns (K_siv, K_name); NK needs the device secret only."""
    return name_subkeys(HK(ds, b"ProtectedStore v2 name key" + kbid + bundle_id.encode("utf-8")))


def device_name_keys(ds: bytes, kbid: bytes):
    """§7 Containers: (K_siv, K_name) of the device's name key NK_dev."""
    return name_subkeys(HK(ds, b"ProtectedStore v2 device name key" + kbid))


def container_id(dev_siv: bytes, bundle_id: str) -> str:
    """§7 Containers: the first 16 bytes of HK(K_siv of NK_dev, "id" || bundle-id),
    as uppercase hex grouped 8-4-4-4-12. The bundle id is taken as UTF-8, as in NK."""
    h = HK(dev_siv, b"id" + bundle_id.encode("utf-8"))[:16].hex().upper()
    return "-".join((h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]))


CONTAINER_DESCRIPTION = "container.sealed"

# The spec says the default class is "a class name as in §4.1", which names
# classes only by id (1-4 = A-D, §3). Accepted here: the letters, and the
# iOS names (README: complete, complete-unless-open,
# complete-until-first-user-authentication, none; spelt kebab-case, camelCase
# or as NSFileProtection... raw values), compared without case and dashes.
CLASS_BY_NAME = {"a": "A", "b": "B", "c": "C", "d": "D",
                 "complete": "A", "completeunlessopen": "B",
                 "completeuntilfirstuserauthentication": "C", "none": "D"}


def class_letter(name) -> str:
    if isinstance(name, str):
        key = name.replace("-", "").lower()
        if key.startswith("nsfileprotection") and len(key) > len("nsfileprotection"):
            key = key[len("nsfileprotection"):]
        if key in CLASS_BY_NAME:
            return CLASS_BY_NAME[key]
    raise FormatError(f"description: defaultProtection {name!r} is not a class name")


def open_container_description(dev_name: bytes, cid: str, sealed: bytes):
    """§7 Containers: nonce (24) || AEAD(K_name of NK_dev, nonce, json,
    "R" || "container" || id as ASCII). Returns (bundle id, class letter).
    The caller checks that the bundle id gives back `cid`."""
    try:
        ad = b"R" + b"container" + cid.encode("ascii")
    except UnicodeEncodeError:  # a folder name that no id has
        raise FormatError("description: folder name is not ASCII, not a container id") from None
    obj = open_sealed_json(dev_name, sealed, ad, "description")
    bundle = obj.get("bundleIdentifier")
    if not isinstance(bundle, str) or not bundle:
        raise FormatError(f"description: bundleIdentifier {bundle!r} is not a non-empty string")
    try:
        bundle.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape in the JSON
        raise FormatError("description: bundleIdentifier is not valid UTF-8") from None
    return bundle, class_letter(obj.get("defaultProtection"))


def read_container_description(dev_siv: bytes, dev_name: bytes, folder: bytes, cid: str):
    """Opens <folder>/container.sealed for container id `cid` and checks that its
    bundle identifier gives back `cid` (else it is not that folder's container)."""
    try:
        fd = os.open(os.path.join(folder, os.fsencode(CONTAINER_DESCRIPTION)), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise FormatError(f"no {CONTAINER_DESCRIPTION}: not a container") from None
    with os.fdopen(fd, "rb") as f:
        bundle, letter = open_container_description(dev_name, cid, f.read())
    if container_id(dev_siv, bundle) != cid:
        raise FormatError(f"description: bundle identifier {show(bundle.encode())} "
                          f"does not give this folder's id")
    return bundle, letter


def b64url(b: bytes) -> bytes:
    """RFC 4648 §5, no padding."""
    return base64.urlsafe_b64encode(b).rstrip(b"=")


def b64url_decode(s: bytes, what: str) -> bytes:
    """Accepts canonical unpadded base64url only: the stored form of a value is
    unique, so a re-encoding that differs (padding, non-zero spare bits) is
    not ours."""
    if not set(s) <= B64URL_ALPHABET or len(s) % 4 == 1:
        raise FormatError(f"{what}: not base64url")
    raw = base64.urlsafe_b64decode(s + b"=" * (-len(s) % 4))
    if b64url(raw) != s:
        raise FormatError(f"{what}: not canonical base64url")
    return raw


def check_plain_name(n: bytes):
    """§7: 1 to 255 bytes of UTF-8, no '/' or NUL, not '.' or '..'."""
    if not 1 <= len(n) <= NAME_MAX:
        raise FormatError(f"name: {len(n)} bytes (1 to {NAME_MAX} allowed)")
    if b"/" in n or b"\0" in n or n in (b".", b".."):
        raise FormatError("name: contains '/' or NUL, or is '.' or '..'")
    try:
        n.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError("name: not valid UTF-8") from None


def decrypt_name(k_siv: bytes, k_name: bytes, iv: bytes, stored: bytes) -> bytes:
    """§7 A name: the checks in the order the spec lists them."""
    raw = b64url_decode(stored, "name")
    if len(raw) < MIN_STORED_NAME or (len(raw) - NONCE_SIZE - TAG_SIZE) % NAME_PAD:
        raise FormatError(f"name: {len(raw)} bytes decoded, not a padded name")
    nonce = raw[:NONCE_SIZE]
    p = aead_open(k_name, nonce, raw[NONCE_SIZE:], b"N" + iv, "name")
    # SIV: the nonce must be the one the name itself determines, else one name
    # could have many stored forms in a directory.
    if not hmac.compare_digest(HK(k_siv, iv + p)[:NONCE_SIZE], nonce):
        raise FormatError("name: nonce is not the one derived from the name (not canonical)")
    n = p.rstrip(b"\0")  # a name has no NUL, so every trailing zero is padding
    if len(p) - len(n) >= NAME_PAD:
        raise FormatError(f"name: {len(p) - len(n)} bytes of padding (fewer than {NAME_PAD} allowed)")
    check_plain_name(n)
    return n


def read_long_name(dirpath: bytes, entry: bytes) -> bytes:
    """§7 Long names: returns the stored name kept for `entry` ("~" + hash),
    after checking it hashes to the entry."""
    digest = b64url_decode(entry[1:], "long name entry")
    if len(digest) != 32:
        raise FormatError(f"long name entry: hash of {len(digest)} bytes, expected 32")
    path = os.path.join(dirpath, LONG_NAME_FILE_PREFIX + entry[1:])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise FormatError("long name: its .sandboxctl-name- file is missing") from None
    with os.fdopen(fd, "rb") as f:
        stored = f.read()
    if not hmac.compare_digest(H(stored), digest):
        raise FormatError("long name: file contents do not hash to the entry")
    return stored


def entry_name(k_siv: bytes, k_name: bytes, dirpath: bytes, iv: bytes, entry: bytes) -> bytes:
    """The plaintext name of a (non-reserved) entry, short or long. Each name
    has one stored form, so a name stored in the other form is rejected."""
    if entry.startswith(LONG_NAME_MARK):
        n = decrypt_name(k_siv, k_name, iv, read_long_name(dirpath, entry))
        if len(n) <= SHORT_NAME_MAX:
            raise FormatError(f"name of {len(n)} bytes stored as a long name")
    else:
        n = decrypt_name(k_siv, k_name, iv, entry)
        if len(n) > SHORT_NAME_MAX:
            raise FormatError(f"name of {len(n)} bytes stored as a short name")
    return n


def decrypt_link_target(k_name: bytes, iv: bytes, stored: bytes) -> bytes:
    """§7 Link targets: "~" then a random nonce, AD "L" || 0x02; the earlier form (no "~") has AD "L" || IV of
    the directory the link was made in."""
    bound = not stored.startswith(b"~")
    raw = b64url_decode(stored if bound else stored[1:], "link target")
    if len(raw) < NONCE_SIZE + TAG_SIZE:
        raise FormatError(f"link target: {len(raw)} bytes decoded, too short")
    padded = aead_open(k_name, raw[:NONCE_SIZE], raw[NONCE_SIZE:], b"L" + (iv if bound else b"\x02"), "link target")
    target = padded.rstrip(b"\0")  # padding: fewer than 16 NULs
    if not target or b"\0" in target or len(padded) - len(target) >= 16:
        raise FormatError("link target: empty, contains NUL, or padded wrongly")
    return target


ATTRIBUTES_NAME = "user.sandboxctl.attributes"


def decrypt_attributes(k_name: bytes, sealed: bytes) -> list:
    """§7 Extended attributes: nonce || AEAD(K_name, A, "R" || "attributes"); A = 0x01, count (u16), then
    |name| (u8), name, |value| (u32), value per attribute, spaces to a multiple of 64. [(name, value)]."""
    if len(sealed) < NONCE_SIZE + TAG_SIZE:
        raise FormatError(f"extended attributes: {len(sealed)} bytes, too short")
    plain = aead_open(k_name, sealed[:NONCE_SIZE], sealed[NONCE_SIZE:], b"R" + b"attributes", "extended attributes")
    if len(plain) < 3 or plain[0] != 1:
        raise FormatError("extended attributes: not version 1")
    (count,) = struct.unpack_from("<H", plain, 1)
    at, found = 3, []
    for _ in range(count):
        if at >= len(plain) or plain[at] == 0:
            raise FormatError("extended attributes: truncated or empty name")
        length = plain[at]
        name = plain[at + 1:at + 1 + length]
        at += 1 + length
        if len(name) != length or at + 4 > len(plain):
            raise FormatError("extended attributes: truncated")
        (size,) = struct.unpack_from("<I", plain, at)
        value = plain[at + 4:at + 4 + size]
        at += 4 + size
        if len(value) != size:
            raise FormatError("extended attributes: truncated value")
        text = name.decode("utf-8")  # UnicodeDecodeError is a ValueError: reported as damage by the caller
        if not text.startswith("user.") or any(text == n for n, _ in found):
            raise FormatError(f"extended attributes: name {text!r} outside user. or repeated")
        found.append((text, value))
    if len(plain) - at >= 64 or plain[at:] != b" " * (len(plain) - at):
        raise FormatError("extended attributes: padded wrongly")
    return found


def read_dir_iv(dirpath: bytes) -> bytes:
    """§7 Directory IV: .sandboxctl-diriv, exactly 16 bytes."""
    try:
        fd = os.open(os.path.join(dirpath, DIRIV_NAME), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise FormatError("directory has no .sandboxctl-diriv") from None
    with os.fdopen(fd, "rb") as f:
        iv = f.read(DIRIV_SIZE + 1)
    if len(iv) != DIRIV_SIZE:
        raise FormatError(f"directory IV is {len(iv)} bytes, expected {DIRIV_SIZE}")
    return iv


# -------------------------------------------------------- Inbox queue (§6)

QUEUE_RECORD_SUFFIX = ".sealed"
QUEUE_SEQUENCE_DIGITS = 20


def queue_sequence(filename: str) -> int:
    """<sequence>.sealed, the sequence as 20 decimal digits."""
    digits = filename[:-len(QUEUE_RECORD_SUFFIX)]
    if len(digits) != QUEUE_SEQUENCE_DIGITS or not (digits.isascii() and digits.isdigit()):
        raise FormatError(f"record name is not {QUEUE_SEQUENCE_DIGITS} decimal digits")
    seq = int(digits)
    if seq >= 2**64:  # the AD holds it as 8 bytes
        raise FormatError("record sequence does not fit 8 bytes")
    return seq


def _reject_duplicate_keys(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise FormatError(f"JSON key {k!r} appears twice")
        obj[k] = v
    return obj


def _reject_constant(c):
    raise FormatError(f"{c} is not JSON")


def open_sealed_json(key: bytes, sealed: bytes, ad: bytes, what: str) -> dict:
    """A sealed record (§6, §7): nonce (24) || AEAD(key, nonce, json, ad), holding one JSON object."""
    if len(sealed) < NONCE_SIZE + TAG_SIZE:
        raise FormatError(f"{what}: {len(sealed)} bytes, too short")
    text = aead_open(key, sealed[:NONCE_SIZE], sealed[NONCE_SIZE:], ad, what)
    try:
        obj = json.loads(text.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys,
                         parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"{what}: not UTF-8 JSON ({e})") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{what}: not a JSON object")
    return obj


def open_queue_record(k_name: bytes, seq: int, sealed: bytes) -> dict:
    """§6: nonce (24) || AEAD(K_name, nonce, json, "R" || "inbox-queue" || seq (u64))."""
    obj = open_sealed_json(k_name, sealed, b"R" + b"inbox-queue" + struct.pack("<Q", seq), "record")
    s = obj.get("sequence")
    if type(s) is not int or s != seq:  # bool is an int subclass: not a sequence
        raise FormatError(f"record: sequence {s!r} differs from its file name's {seq}")
    # Records naming nothing deliverable are ignored by receivers (§6).
    for key in ("name", "stagingName"):
        n = obj.get(key)
        if not isinstance(n, str) or n in ("", ".", "..") or "/" in n or "\0" in n:
            raise FormatError(f"record: {key} {n!r} is empty, '.', '..', or contains '/' or NUL")
    return obj


# ---------------------------------------------------------- container (§7)

def show(b: bytes) -> str:
    """A decrypted name or target for one output line: names may hold any
    character but '/' and NUL (a line break would forge a line), and a target
    need not be UTF-8, so control characters and invalid bytes are escaped."""
    def esc(c):
        o = ord(c)
        if o < 0x20 or 0x7f <= o < 0xa0 or c in "\u2028\u2029":
            return f"\\x{o:02x}" if o <= 0xff else f"\\u{o:04x}"
        return c
    return "".join(esc(c) for c in b.decode("utf-8", "backslashreplace"))


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def decrypt_file_to(path, out_dir, name, kbid, keys, pk_b):
    """decrypt_file, writing the plaintext to out_dir/name when out_dir is
    given. Only a fully authenticated file is ever left under its name: the
    plaintext goes to a hidden temporary file, renamed on success and removed
    on failure. mkstemp, not a name derived from `name`: that could exceed
    NAME_MAX or be another decrypted name."""
    if out_dir is None:
        return decrypt_file(path, kbid, keys, pk_b)
    dest = os.path.join(os.fsencode(out_dir), os.fsencode(name))
    fd, tmp = tempfile.mkstemp(prefix=b".partial-", dir=os.fsencode(out_dir))
    try:
        with os.fdopen(fd, "wb") as sink:
            os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
            result = decrypt_file(path, kbid, keys, pk_b, sink)
        os.replace(tmp, dest)
        tmp = None
        return result
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


class ContainerDecryptor:
    """Walks a container's data directory (bytes paths throughout: stored names
    are whatever is on disk) and, with an output directory, rebuilds the
    plaintext tree. Failures are reported and counted, never fatal, so one bad
    entry does not hide the rest."""

    def __init__(self, container_dir: str, out, kbid, keys, pk_b, k_siv, k_name):
        self.container_dir = os.fsencode(container_dir)
        self.out = None if out is None else os.fsencode(out)
        self.kbid, self.keys, self.pk_b = kbid, keys, pk_b
        self.k_siv, self.k_name = k_siv, k_name
        self.failed = 0

    def fail(self, stored: bytes, message: str, plain: str = None):
        where = os.fsdecode(stored) + (f" ({plain})" if plain else "")
        print(f"{where}: FAILED {message}", file=sys.stderr)
        self.failed += 1

    def run(self):
        data = os.path.join(self.container_dir, b"Data")
        if self.out is not None:
            os.makedirs(self.out, exist_ok=True)
        self.walk(data, "", self.out)
        self.decrypt_queue(os.path.join(self.container_dir, b"inbox-queue"))

    def walk(self, dirpath: bytes, rel: str, out_dir):
        """Decrypts the names in dirpath, then each item in name order.
        `rel` is dirpath's decrypted path relative to Data ("" or ending in "/")."""
        try:
            entries = sorted(os.listdir(dirpath))
            iv = read_dir_iv(dirpath)
        except (FormatError, OSError) as e:
            self.fail(dirpath, str(e), rel or None)
            return
        if rel:
            print(f"{rel}: OK directory")
        items = []
        for entry in entries:
            if entry.startswith(RESERVED_PREFIX):
                continue
            stored = os.path.join(dirpath, entry)
            try:
                items.append((entry_name(self.k_siv, self.k_name, dirpath, iv, entry), stored))
            except (FormatError, OSError) as e:
                self.fail(stored, str(e))
        for name, stored in sorted(items):
            self.item(stored, name, rel + show(name), iv, out_dir)

    def item(self, stored: bytes, name: bytes, rel: str, iv: bytes, out_dir):
        """One non-reserved entry, by its type on disk (never followed)."""
        dest = None if out_dir is None else os.path.join(out_dir, name)
        try:
            mode = os.lstat(stored).st_mode
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                self.report_attributes(stored, rel)
            if stat.S_ISDIR(mode):
                if dest is not None:
                    self.ensure_output(dest, stat.S_ISDIR, os.mkdir)
                self.walk(stored, rel + "/", dest)
            elif stat.S_ISREG(mode):
                letter, size = decrypt_file_to(stored, out_dir, name, self.kbid, self.keys, self.pk_b)
                print(f"{rel}: OK {size} bytes class {letter}")
            elif stat.S_ISLNK(mode):
                target = decrypt_link_target(self.k_name, iv, os.readlink(stored))
                if dest is not None:
                    self.replace_with_symlink(target, dest)
                print(f"{rel} -> {show(target)}: OK link")
            elif stat.S_ISFIFO(mode):
                if dest is not None:
                    self.ensure_output(dest, stat.S_ISFIFO, os.mkfifo)
                print(f"{rel}: OK fifo")
            else:  # a socket means nothing once copied; nodev: no device nodes
                print(f"{rel}: OK {stat.filemode(mode)[0]} (not recreated)")
        except (FormatError, OSError) as e:
            self.fail(stored, str(e), rel)

    @staticmethod
    def ensure_output(dest: bytes, is_kind, make):
        """Makes dest unless an earlier run left one of the same kind. lstat,
        not stat: a link left at dest must not lead the output elsewhere (make
        then fails with EEXIST)."""
        try:
            if is_kind(os.lstat(dest).st_mode):
                return
        except FileNotFoundError:
            pass
        make(dest)

    def report_attributes(self, stored: bytes, rel: str):
        """The item's user.* extended attributes, by name and size (§7); damage is a failure of its own."""
        try:
            sealed = os.getxattr(stored, ATTRIBUTES_NAME, follow_symlinks=False)
        except OSError as e:
            if e.errno in (errno.ENODATA, errno.ENOTSUP):
                return
            raise
        try:
            found = decrypt_attributes(self.k_name, sealed)
        except (FormatError, ValueError) as e:
            self.fail(stored, str(e), rel)
            return
        listed = ", ".join(f"{name} ({len(value)} bytes)" for name, value in found)
        print(f"{rel}: OK attributes {listed}")

    @staticmethod
    def replace_with_symlink(target: bytes, dest: bytes):
        """A symbolic link at dest (replacing a link or file left by an earlier run)."""
        tmp = os.path.join(os.path.dirname(dest), os.fsencode(f".partial-link-{os.getpid()}"))
        os.symlink(target, tmp)
        try:
            os.replace(tmp, dest)
        except OSError:
            os.unlink(tmp)
            raise

    def decrypt_queue(self, queue_dir: bytes):
        """§6: every <sequence>.sealed record, in sequence order, and the sealed
        state. The lock, the old counter file and hidden temporary files are not records."""
        try:
            names = os.listdir(os.fsdecode(queue_dir))
        except FileNotFoundError:
            return  # nothing was ever delivered
        except OSError as e:
            self.fail(queue_dir, str(e))
            return
        for filename in sorted(names):
            if filename.startswith(".") or not filename.endswith(QUEUE_RECORD_SUFFIX):
                continue
            path = os.path.join(queue_dir, os.fsencode(filename))
            if filename == "state.sealed":
                try:
                    with open(path, "rb") as f:
                        state = open_sealed_json(self.k_name, f.read(), b"R" + b"inbox-queue-state", "queue state")
                except (FormatError, OSError) as e:
                    self.fail(path, str(e))
                    continue
                print(f"inbox-queue state: {json.dumps(state, separators=(',', ':'))}")
                continue
            try:
                seq = queue_sequence(filename)
                with open(path, "rb") as f:
                    obj = open_queue_record(self.k_name, seq, f.read())
            except (FormatError, OSError) as e:
                self.fail(path, str(e))
                continue
            print(f"inbox-queue {seq}: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}")


# ------------------------------------------------------------------- CLI

def container_line(cid: str, bundle: str, letter: str) -> str:
    return f"container {cid}: {show(bundle.encode('utf-8'))}, default class {letter}"


def decrypt_container(args, ds, kbid, keys, pk_b) -> int:
    """--container: the container's folder is named by its id (§7 Containers);
    its description is checked first, then Data and the Inbox queue."""
    try:
        k_siv, k_name = container_name_keys(ds, kbid, args.container)
    except UnicodeEncodeError:  # an argv that is not UTF-8
        print("error: --container: bundle identifier is not valid UTF-8", file=sys.stderr)
        return 2
    dev_siv, dev_name = device_name_keys(ds, kbid)
    cid = container_id(dev_siv, args.container)
    folder = os.path.join(args.root, "containers", cid)
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        print(f"error: {folder}: no such container folder (no container {args.container!r})",
              file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {folder}: {e}", file=sys.stderr)
        return 1
    if not stat.S_ISDIR(mode):
        print(f"error: {folder}: not a directory", file=sys.stderr)
        return 1
    walker = ContainerDecryptor(folder, args.out or None, kbid, keys, pk_b, k_siv, k_name)
    description = os.path.join(os.fsencode(folder), os.fsencode(CONTAINER_DESCRIPTION))
    try:
        bundle, letter = read_container_description(dev_siv, dev_name, os.fsencode(folder), cid)
        if bundle != args.container:  # same id, other name: cannot happen short of a collision
            raise FormatError(f"description: bundle identifier {show(bundle.encode('utf-8'))} "
                              f"is not {args.container!r}")
        print(container_line(cid, bundle, letter))
    except (FormatError, OSError) as e:
        walker.fail(description, str(e))  # the data is still readable: its keys need the bundle id only
    try:
        walker.run()
    except OSError as e:  # the output directory itself
        print(f"error: {e}", file=sys.stderr)
        return 1
    if walker.failed:
        print(f"error: {walker.failed} item(s) rejected", file=sys.stderr)
        return 1
    return 0


def list_containers(args, ds, kbid) -> int:
    """--list-containers: every <root>/containers/<id>/ whose description opens
    for its folder and whose bundle identifier gives back that id (§7)."""
    dev_siv, dev_name = device_name_keys(ds, kbid)
    top = os.path.join(os.fsencode(args.root), b"containers")
    try:
        names = sorted(os.listdir(top))
    except FileNotFoundError:
        return 0  # no container was ever created
    except OSError as e:
        print(f"error: {os.fsdecode(top)}: {e}", file=sys.stderr)
        return 1
    failed = 0
    for name in names:
        if name.startswith(RESERVED_PREFIX):
            continue
        folder = os.path.join(top, name)
        description = os.path.join(folder, os.fsencode(CONTAINER_DESCRIPTION))
        where = folder
        try:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                where, problem = folder, "not a directory, not a container"
            elif not name.isascii():  # ids are ASCII: its AD could not even be formed
                where, problem = folder, "folder name is not a container id"
            else:
                where, problem = description, None
                cid = name.decode("ascii")
                bundle, letter = read_container_description(dev_siv, dev_name, folder, cid)
        except (FormatError, OSError) as e:
            problem = str(e)
        if problem is not None:
            print(f"{os.fsdecode(where)}: FAILED {problem}", file=sys.stderr)
            failed += 1
            continue
        print(container_line(cid, bundle, letter))
    if failed:
        print(f"error: {failed} container folder(s) rejected", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Independent ProtectedStore decryptor: encrypted files (format v2), or with "
                    "--container a whole container (sealed description, data directory with "
                    "encrypted names v2, Inbox queue), or with --list-containers every container's "
                    "description. Passcode on stdin. Exit status: 0 all OK, 1 something rejected, "
                    "2 keybag/device secret/passcode problem.")
    ap.add_argument("--root", required=True, help="device root (contains 'keybag')")
    ap.add_argument("--device-secret", required=True, help="64-byte device secret file")
    ap.add_argument("--out", help="directory to write plaintexts to (FILE: as <basename>; "
                                  "--container: the decrypted tree of Data)")
    ap.add_argument("--container", metavar="BUNDLE_ID",
                    help="decrypt the container of BUNDLE_ID, <root>/containers/<id> with <id> "
                         "derived from the device name key: check its sealed description "
                         "(container.sealed), then every name, file and link target under Data, "
                         "and the Inbox queue records (instead of FILE arguments)")
    ap.add_argument("--list-containers", action="store_true",
                    help="open and check every <root>/containers/*/container.sealed and print "
                         "'container <id>: <bundle id>, default class <X>' for each (instead of "
                         "FILE arguments or --container)")
    ap.add_argument("files", nargs="*", metavar="FILE")
    args = ap.parse_args(argv)
    if args.list_containers:
        if args.files or args.container is not None:
            ap.error("--list-containers takes no FILE arguments and no --container")
        if args.out:
            ap.error("--out has no effect with --list-containers")
    elif args.container is None and not args.files:
        ap.error("give FILE arguments, --container or --list-containers")
    if args.container is not None:
        if args.files:
            ap.error("FILE arguments and --container are exclusive")
        # Hashed into the folder's id, so it need not be a safe file name; it
        # must be a bundle identifier (a description's is never empty).
        if args.container == "" or "\0" in args.container:
            ap.error(f"--container: {args.container!r} is not a bundle identifier")

    line = sys.stdin.buffer.readline()
    passcode = line[:-1] if line.endswith(b"\n") else line
    if passcode.endswith(b"\r"):
        passcode = passcode[:-1]
    try:
        passcode.decode("utf-8")
    except UnicodeDecodeError:
        print("error: passcode is not valid UTF-8", file=sys.stderr)
        return 2

    try:
        ds_kbid, ds = read_device_secret(args.device_secret)
        secret = args.device_secret[:-5] if args.device_secret.endswith(".cred") else args.device_secret
        kbid, keys, pk_b = open_keybag(os.path.join(args.root, "keybag"), ds_kbid, ds, passcode, secret + ".binding")
    except (FormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.list_containers:
        return list_containers(args, ds, kbid)
    if args.container is not None:
        return decrypt_container(args, ds, kbid, keys, pk_b)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
    failed = 0
    for path in args.files:
        try:
            letter, size = decrypt_file_to(path, args.out or None, os.path.basename(path),
                                           kbid, keys, pk_b)
        except (FormatError, OSError) as e:
            print(f"{path}: FAILED {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: OK {size} bytes class {letter}")
    if failed:
        print(f"error: {failed} of {len(args.files)} file(s) rejected", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
