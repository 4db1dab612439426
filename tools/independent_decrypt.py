#!/usr/bin/env python3
"""Independent decryptor for ProtectedStore on-disk format version 1.

Written only from docs/FORMAT.md, as a check that the specification is
sufficient. Depends on PyNaCl (libsodium bindings) and the standard library.

Usage:
    python3 tools/independent_decrypt.py --root ROOT --device-secret SECRET_FILE \
        [--out DIR] FILE... < passcode

The passcode is read as one line from stdin (the line terminator is removed,
nothing else). For each FILE the output is "FILE: OK <size> bytes class <X>".
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

HEADER_SIZE = 148
BLOCK_OVERHEAD = 40  # 24-byte nonce + 16-byte tag


def plaintext_size(file_size: int, B: int):
    """§4.3: returns (number of blocks n, plaintext size P)."""
    body = file_size - HEADER_SIZE
    if body < BLOCK_OVERHEAD:
        raise FormatError(f"file too short ({file_size} bytes)")
    S = B + BLOCK_OVERHEAD
    n = -(-body // S)
    last = body - (n - 1) * S
    if n > 1 and last - BLOCK_OVERHEAD < 1:
        raise FormatError("invalid file size (impossible final block length)")
    return n, (n - 1) * B + last - BLOCK_OVERHEAD


def decrypt_file(path: str, kbid: bytes, keys: dict, pk_b: bytes):
    """Returns (class letter, plaintext). Raises FormatError on any failure."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_SIZE:
        raise FormatError(f"file too short for a header ({len(data)} bytes)")
    hdr = data[:HEADER_SIZE]
    if hdr[0:4] != b"PSEF":
        raise FormatError("bad magic")
    if u16(hdr, 4) != 1:
        raise FormatError(f"unsupported version {u16(hdr, 4)}")
    cid = hdr[6]
    if cid not in CLASS_LETTERS:
        raise FormatError(f"bad protection class id {cid}")
    if hdr[7] != 0:
        raise FormatError("reserved header byte not zero")
    B = u32(hdr, 8)
    if not (512 <= B <= 1048576 and B & (B - 1) == 0):
        raise FormatError(f"bad block size {B}")
    if hdr[12:28] != kbid:
        raise FormatError("file was written by another device (keybag id mismatch)")
    fid, eph = hdr[28:44], hdr[44:76]

    if cid == 2:
        shared = x25519(keys[2], eph)
        wrap_key = H(b"ProtectedStore v1 class B wrap" + eph + pk_b + shared)
    else:
        if eph != bytes(32):
            raise FormatError("ephemeral key field not zero for a non-B class")
        wrap_key = keys[cid]
    fk = unwrap(wrap_key, hdr[76:148], hdr[0:76], "header (per-file key)")

    n, size = plaintext_size(len(data), B)
    S = B + BLOCK_OVERHEAD
    out = bytearray()
    for i in range(n):
        blk = data[HEADER_SIZE + i * S: HEADER_SIZE + (i + 1) * S]
        final = 1 if i == n - 1 else 0
        ad = fid + struct.pack("<QB", i, final)
        out += aead_open(fk, blk[:24], blk[24:], ad, f"block {i}")
    if len(out) != size:  # cannot happen if the arithmetic above is right
        raise FormatError(f"plaintext size {len(out)} != computed {size}")
    return CLASS_LETTERS[cid], bytes(out)


# ------------------------------------------------------------------- CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Independent ProtectedStore v1 decryptor (passcode on stdin).")
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
        try:
            letter, pt = decrypt_file(path, kbid, keys, pk_b)
        except (FormatError, OSError) as e:
            print(f"{path}: FAILED {e}", file=sys.stderr)
            failed += 1
            continue
        if args.out:  # only fully authenticated plaintext is ever written
            with open(os.path.join(args.out, os.path.basename(path)), "wb") as f:
                f.write(pt)
        print(f"{path}: OK {len(pt)} bytes class {letter}")
    if failed:
        print(f"error: {failed} of {len(args.files)} file(s) rejected", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
