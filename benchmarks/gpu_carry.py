"""A pretrained model's GGUF, carried to the lent GPU machine in parts: that machine reaches no package registry and a
device call carries at most 64 MiB (the working tree included), less than SmolLM2's GGUF (98 MB) or Gemma 3's (253 MB).

    python benchmarks/gpu_carry.py pack smollm2     # here: the parts, a manifest and the device calls to make
    python benchmarks/gpu_carry.py join benchmarks/.carry/smollm2.carry.json    # there: the file back, checked

`bash benchmarks/gpu_check.sh --carry MODEL` runs `pack` after fetching the wheels the retrofit needs, and
`--retrofit MODEL` runs `join` before the retrofit (docs/pretrained.md, "On a lent GPU").

Decisions:
- The calls go to one warm machine, one after the other: a file a call carried into an ignored folder stays there for
  the next call, so the parts gather in benchmarks/.carry/ (git-ignored) and the last call joins them. The plan fills
  each call up to --call_mib (60: a margin under 64) less what the working tree weighs now (tracked and untracked
  files that git does not ignore: what travels with every call); the first call also takes the wheels folder.
- The manifest holds each part's and the whole file's SHA-256: `join` names a missing or damaged part, writes the
  file to a temporary name and renames it only once its digest is right, and does nothing when the file is there
  already with that digest (a second device call on the same machine).
- `join` needs only the standard library: it runs on the device's own python3 before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY = Path("benchmarks/.carry")  # relative to the repository root, as the device calls name it
MIB = 1 << 20
CHUNK = 8 * MIB
MODELS = ("smollm2", "gemma3")  # the GGUFs packaged for `bash setup.sh pretrained` (swax import's names)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def tree_bytes(root: Path = ROOT) -> int:
    """What every device call sends besides its carry: the files git tracks or would track (not the ignored ones)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.split(b"\0")
    files = [root / os.fsdecode(name) for name in listed if name]
    return sum(path.stat().st_size for path in files if path.is_file())  # a deleted file is still listed


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def part_sizes(total: int, first: int, rest: int) -> list[int]:
    """Sizes of the parts of a `total`-byte file, one part a call, when the first call has room for `first` bytes
    and each later one for `rest`."""
    if min(first, rest) < MIB:
        raise ValueError(f"less than 1 MiB left for a part in a call (the first {first / MIB:.1f} MiB, then "
                         f"{rest / MIB:.1f}): raise --call_mib (at most 64) or carry fewer wheels")
    sizes = [min(first, total)]
    while sum(sizes) < total:
        sizes.append(min(rest, total - sum(sizes)))
    return sizes


def pack(model: str, out: Path, call_mib: float, wheels: Path | None) -> dict:
    """Split the model's GGUF into `out` (parts and manifest); return the manifest with the calls to make."""
    from swax_lightning.pretrained.hf_import import resolve_source  # here only: it needs the installed package

    source = resolve_source(model)
    tree = tree_bytes()
    extra = folder_bytes(ROOT / wheels) if wheels else 0
    room = int(call_mib * MIB) - tree
    sizes = part_sizes(source.stat().st_size, room - extra, room)
    (ROOT / out).mkdir(parents=True, exist_ok=True)
    for old in (ROOT / out).glob(f"{source.name}.part*"):
        old.unlink()
    parts = []
    with open(source, "rb") as f:
        for i, size in enumerate(sizes):
            path = out / f"{source.name}.part{i:02d}"
            (ROOT / path).write_bytes(f.read(size))
            parts.append({"path": str(path), "bytes": size, "sha256": sha256(ROOT / path)})
    manifest_path = out / f"{model}.carry.json"
    calls = [[part["path"]] for part in parts]
    if wheels:
        calls[0].insert(0, str(wheels))
    calls[-1].append(str(manifest_path))
    manifest = {"model": model, "file": str(out / source.name), "bytes": source.stat().st_size,
                "sha256": sha256(source), "parts": parts, "calls": calls, "tree_bytes": tree, "call_mib": call_mib}
    (ROOT / manifest_path).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def join(manifest_path: Path) -> Path:
    """The file of a manifest, from its parts (paths relative to the current folder: the repository root)."""
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path}: no such manifest (carry it with the last part)")
    manifest = json.loads(manifest_path.read_text())
    target = Path(manifest["file"])
    if target.is_file() and target.stat().st_size == manifest["bytes"] and sha256(target) == manifest["sha256"]:
        return target
    for part in manifest["parts"]:
        path = Path(part["path"])
        if not path.is_file():
            raise FileNotFoundError(f"{path}: part missing (each device call carries the parts the plan gives it, "
                                    "to the same warm machine)")
        if path.stat().st_size != part["bytes"] or sha256(path) != part["sha256"]:
            raise ValueError(f"{path}: damaged part ({path.stat().st_size} bytes; the manifest says {part['bytes']} "
                             "and another SHA-256)")
    partial = target.with_name(target.name + ".joining")
    with open(partial, "wb") as out:
        for part in manifest["parts"]:
            out.write(Path(part["path"]).read_bytes())
    if sha256(partial) != manifest["sha256"]:
        partial.unlink()
        raise ValueError(f"{target}: the joined parts do not give the manifest's SHA-256")
    os.replace(partial, target)
    return target


def print_calls(manifest: dict) -> None:
    """The device calls, in order, each within its warm machine's idle time of the last."""
    calls = manifest["calls"]
    print(f"{manifest['file']}: {manifest['bytes'] / MIB:.1f} MiB in {len(manifest['parts'])} parts; the working tree "
          f"sends {manifest['tree_bytes'] / MIB:.1f} MiB with every call. Device calls, one after the other:")
    for i, carry in enumerate(calls, 1):
        command = ("ls -l benchmarks/.carry" if i < len(calls) else
                   f"GPU_CHECK_LOGS=/tmp/gpu_check bash benchmarks/gpu_check.sh --retrofit {manifest['model']} "
                   "/tmp/gpu_check/summary.json; tar czf $OUT/gpu_retrofit.tgz -C /tmp/gpu_check .")
        print(f"  {i}. carry {json.dumps(carry)}\n     command: {command}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pack_parser = sub.add_parser("pack", help="split a packaged GGUF into parts that fit the device calls")
    pack_parser.add_argument("model", choices=MODELS, help="a packaged GGUF, by swax import's name")
    pack_parser.add_argument("--out", type=Path, default=CARRY, help="folder for the parts, relative to the repo root")
    pack_parser.add_argument("--call_mib", type=float, default=60.0, help="what one call may carry, MiB (limit 64)")
    pack_parser.add_argument("--wheels", type=Path, default=None, help="a folder the first call carries too")
    join_parser = sub.add_parser("join", help="the file back from its parts, checked")
    join_parser.add_argument("manifest", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            print_calls(pack(args.model, args.out, args.call_mib, args.wheels))
        else:
            print(f"joined: {join(args.manifest)}")
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
