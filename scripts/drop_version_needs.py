#!/usr/bin/env python3
"""Removes from an ELF64 executable the symbol-version requirements on shared libraries it no longer
needs: the step `patchelf --remove-needed` leaves undone.

Why it exists: scripts/build_cuda.sh leaves the CUDA libraries out of the `cuda` binary's needed ones,
so that it starts on machines without them and loads them when a GPU is asked for (src/device.rs).
`patchelf --remove-needed` drops the DT_NEEDED entries and `--clear-symbol-version` the symbols'
versions, but the version-needs section (.gnu.version_r) still names each library, and the dynamic
loader then stops at start-up ("Inconsistency detected by ld.so: dl-version.c: Assertion `needed !=
NULL' failed"). This unlinks those entries from the section's chain (and moves DT_VERNEED past them
when they come first) and lowers DT_VERNEEDNUM; nothing is moved or resized.

Usage: drop_version_needs.py BINARY LIBRARY...   (in place; exits 1 naming what it cannot do)
"""

import os
import struct
import sys

DT_NULL, DT_STRTAB = 0, 5
DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFE, 0x6FFFFFFF
PT_LOAD, PT_DYNAMIC = 1, 2


def fail(msg):
    sys.exit(f"drop_version_needs.py: {msg}")


def main():
    if len(sys.argv) < 3:
        fail("usage: drop_version_needs.py BINARY LIBRARY...")
    path, drop = sys.argv[1], set(sys.argv[2:])
    data = bytearray(open(path, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        fail(f"{path}: not a little-endian ELF64 file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = p_offset
    if dynamic is None:
        fail(f"{path}: no dynamic section")

    def offset(addr):
        for vaddr, off, size in loads:
            if vaddr <= addr < vaddr + size:
                return off + addr - vaddr
        fail(f"{path}: address {addr:#x} is in no loaded segment")

    # The dynamic entries: (file offset of the entry, tag, value).
    entries, at = {}, dynamic
    while True:
        tag, val = struct.unpack_from("<qQ", data, at)
        if tag == DT_NULL:
            break
        entries[tag] = (at, val)
        at += 16
    if DT_VERNEED not in entries:
        return  # no version needs at all
    strtab = offset(entries[DT_STRTAB][1])

    def name(off):
        end = data.index(b"\0", strtab + off)
        return data[strtab + off:end].decode()

    # The chain of Elf64_Verneed entries: vn_version, vn_cnt, vn_file, vn_aux, vn_next.
    first_addr = entries[DT_VERNEED][1]
    chain, at = [], offset(first_addr)
    while True:
        _, _, vn_file, _, vn_next = struct.unpack_from("<HHIII", data, at)
        chain.append((at, name(vn_file)))
        if vn_next == 0:
            break
        at += vn_next
    kept = [(at, lib) for at, lib in chain if lib not in drop]
    if len(kept) == len(chain):
        return
    if not kept:
        fail(f"{path}: every version need would go; not handled")
    for (at, _), (nxt, _) in zip(kept, kept[1:]):
        if nxt <= at:
            fail(f"{path}: version needs out of order; not handled")
        struct.pack_into("<I", data, at + 12, nxt - at)
    struct.pack_into("<I", data, kept[-1][0] + 12, 0)
    dyn_at, _ = entries[DT_VERNEED]
    struct.pack_into("<Q", data, dyn_at + 8, first_addr + kept[0][0] - chain[0][0])
    num_at, _ = entries[DT_VERNEEDNUM]
    struct.pack_into("<Q", data, num_at + 8, len(kept))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, os.stat(path).st_mode)
    os.replace(tmp, path)
    print(f"dropped the version needs on {', '.join(lib for _, lib in chain if lib in drop)}")


if __name__ == "__main__":
    main()
