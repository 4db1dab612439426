#!/usr/bin/env python3
"""Independent decryptor for ProtectedStore: reads encrypted-file format
version 2 (keybag and device secret: version 1).

Written only from docs/FORMAT.md, as a check that the specification is
sufficient. Depends on PyNaCl (libsodium bindings) and the standard library.

Usage:
    python3 tools/independent_decrypt.py --root ROOT --device-secret SECRET_FILE \
        [--out DIR] FILE... < passcode

The passcode is read as one line from stdin (the line terminator is removed,
nothing else). For each FILE the output is "FILE: OK <size> bytes class <X>",
<size> being the plaintext size L from the file's length record (§4.2).
Exit status: 0 all files OK, 1 at least one file rejected, 2 keybag/device
secret/passcode problem (nothing decrypted).
"""

import argparse
import hashlib
import hmac
import os
import struct
import sys

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


def open_keybag(path: str, ds_kbid: bytes, ds: bytes, passcode: bytes):
    """Returns (KBID, {class id: class key}, PK_B). Class 2's key is SK_B."""
    with open(path, "rb") as f:
        kb = f.read()
    if len(kb) != KEYBAG_SIZE:
        raise FormatError(f"keybag: size {len(kb)}, expected {KEYBAG_SIZE}")
    if kb[0:8] != b"PSKEYBAG":
        raise FormatError("keybag: bad magic")
    if u16(kb, 8) != 1:
        raise FormatError(f"keybag: unsupported version {u16(kb, 8)}")
    if u16(kb, 10) != 0:
        raise FormatError("keybag: flags not zero")
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

    p = nacl.pwhash.argon2id.kdf(32, passcode, salt, opslimit=ops, memlimit=mem)
    k_pass = HK(ds, b"ProtectedStore v1 passcode key" + kbid + p)

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
BLOCK_OVERHEAD = 40        # 24-byte nonce + 16-byte tag
FILE_VERSION = 2
CIPHER_XCHACHA20POLY1305 = 1
FLAG_AWAITS_DEFAULT_CLASS = 0x01
MAX_STALE_TAILS = 16


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def lmax(B: int) -> int:
    """§4.4: Lmax = (floor((2^63 - 1 - 1024) / (BS + 40)) - 1) * BS."""
    return ((2**63 - 1 - BODY_OFFSET) // (B + BLOCK_OVERHEAD) - 1) * B


def check_header(hdr: bytes):
    """§4.1 / §4.5 step 1 (keyless). Returns (class id, BS)."""
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
    if hdr[8] != CIPHER_XCHACHA20POLY1305:
        raise FormatError(f"unsupported format: cipher id {hdr[8]}")
    if hdr[9:12] != bytes(3):
        raise FormatError("reserved header bytes 9..<12 not zero")
    if hdr[152:512] != bytes(360):
        raise FormatError("header padding bytes 152..<512 not zero")
    B = u32(hdr, 12)
    if not (512 <= B <= 1048576 and B & (B - 1) == 0):
        raise FormatError(f"bad block size {B}")
    return cid, B


def check_record_keyless(rec: bytes, B: int):
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
    lm = lmax(B)
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
        L, X, S, tails = check_record_keyless(rec, B)
        check_record_tag(rec, fk, fid)
        SB = B + BLOCK_OVERHEAD
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
                pt = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(blk[24:], ad, blk[:24], fk)
            except nacl.exceptions.CryptoError:
                if blk == bytes(SB):
                    continue  # rule 3: a hole, zeros
                raise FormatError(f"block {i}: authentication failed") from None
            if len(pt) != B:  # cannot happen: the ciphertext is BS + 16 bytes
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


# ------------------------------------------------------------------- CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Independent ProtectedStore decryptor, encrypted-file format v2 (passcode on stdin).")
    ap.add_argument("--root", required=True, help="device root (contains 'keybag')")
    ap.add_argument("--device-secret", required=True, help="64-byte device secret file")
    ap.add_argument("--out", help="directory to write plaintexts to (as <basename>)")
    ap.add_argument("files", nargs="+", metavar="FILE")
    args = ap.parse_args(argv)

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
        kbid, keys, pk_b = open_keybag(os.path.join(args.root, "keybag"), ds_kbid, ds, passcode)
    except (FormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.out:
        os.makedirs(args.out, exist_ok=True)
    failed = 0
    for path in args.files:
        tmp = None
        try:
            if args.out:
                # Only a fully authenticated file is ever left under its name:
                # the plaintext goes to a hidden temporary file, renamed on
                # success and removed on failure.
                dest = os.path.join(args.out, os.path.basename(path))
                tmp = os.path.join(args.out, f".{os.path.basename(path)}.partial-{os.getpid()}")
                with open(tmp, "wb") as sink:
                    letter, size = decrypt_file(path, kbid, keys, pk_b, sink)
                os.replace(tmp, dest)
                tmp = None
            else:
                letter, size = decrypt_file(path, kbid, keys, pk_b)
        except (FormatError, OSError) as e:
            print(f"{path}: FAILED {e}", file=sys.stderr)
            failed += 1
            continue
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        print(f"{path}: OK {size} bytes class {letter}")
    if failed:
        print(f"error: {failed} of {len(args.files)} file(s) rejected", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
