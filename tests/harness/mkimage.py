#!/usr/bin/env python3
"""Build and inspect single-layer OCI images as `docker save` (docker-archive) tarballs.

No registry, no Docker engine: the image is a deterministic tar (mtime 0, sorted paths, owner 0:0
except /home/nonroot, which is 65532's as in distroless) of a tiny distroless-like root filesystem:
the given binaries, every shared library and the ELF interpreter `ldd` names for them (copied,
symlinks resolved, to the path ldd prints), /tmp (1777), /etc/passwd and /etc/group with root (0),
nobody (65534) and nonroot (65532) as in distroless, /root, /home/nonroot, and empty /proc, /sys,
/dev mount points. `ctr images import` and
`docker load` read the result. tests/harness/images.sh drives it (`make images`).

Usage:
  mkimage.py build --ref REF --out TAR [--dockerfile FILE --bin-dir DIR]
                   [--add SRC:DEST ...] [--libs-of SRC ...] [--entrypoint JSON] [--cmd JSON] [--user USER]
                   [--label KEY=VALUE ...] [--created TIME]
      Builds TAR for REF (e.g. localhost/aether/aether-agent:dev). With --dockerfile, the final
      stage of FILE gives the binaries (each `COPY --from=<stage> /out/<bin>... <dest>` copies
      DIR/<bin>), USER, ENTRYPOINT, CMD and EXPOSE; --entrypoint/--cmd/--user are then refused.
      --add copies the host file SRC to the absolute image path DEST (mode 0755).
      --libs-of adds only the libraries and interpreter SRC needs (a binary another image brings).
      --label sets a label of the image config (`config.Labels`, e.g. the OCI annotation keys
      org.opencontainers.image.*); --created the config's and its history's `created` time
      (RFC 3339 in UTC, `YYYY-MM-DDTHH:MM:SSZ`; default the epoch), e.g. the commit's time, so
      the tarball stays a function of its inputs.
      The digest of every input (this script, the spec, each file's content) is kept next to TAR
      in TAR.inputs: when it is unchanged and TAR exists, nothing is rebuilt.
      Prints one line: REF<TAB>TAR<TAB>SIZE-IN-BYTES<TAB>built|unchanged
  mkimage.py dockerfile FILE
      Prints, as JSON, what the final stage of FILE says: user, entrypoint, cmd, exposed ports
      and copies ({source, binary, dest}); exits 1 naming the line and the rule it breaks otherwise.
  mkimage.py inspect TAR
      Prints, as JSON, the image's repo tags, platform, created time, config (labels included),
      every path of its layers (type, mode, uid, gid, size) and, for each dynamically linked ELF
      executable, its interpreter, the libraries it needs (transitively) and which of them the
      image lacks.

Stdlib only.
"""
import argparse
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import tarfile
import tempfile

PATH_ENV = "PATH=/usr/local/bin:/usr/bin:/bin"
CREATED = "1970-01-01T00:00:00Z"
# The image's architecture: the build machine's, whose binaries and libraries go in (GOARCH
# names, as OCI image configs use them). The release builds each architecture on a machine of it.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
# Directories the dynamic loader searches when neither RPATH nor RUNPATH names the library
# (glibc's trusted dirs on Debian/Ubuntu x86-64 and arm64, then the generic ones).
DEFAULT_LIB_DIRS = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
]
PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
    "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
)
GROUP = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
# (path, mode, uid) of the directories every image has; parents of files get 0755 root.
BASE_DIRS = [
    ("/tmp", 0o1777, 0),
    ("/proc", 0o555, 0),
    ("/sys", 0o555, 0),
    ("/dev", 0o755, 0),
    ("/etc", 0o755, 0),
    ("/root", 0o700, 0),
    ("/home/nonroot", 0o700, 65532),
    ("/usr/local/bin", 0o755, 0),
]
# Final-stage instructions a Dockerfile may use here; anything else (RUN, ENV, WORKDIR, LABEL, ...)
# changes the image in a way this builder would silently not reproduce, so it is an error.
FINAL_STAGE_INSTRUCTIONS = {"FROM", "COPY", "USER", "ENTRYPOINT", "CMD", "EXPOSE"}


class ImageError(Exception):
    """A problem with an input; the message names the file and the rule."""


# ---------------------------------------------------------------------------------------------
# Dockerfile: the final stage's USER, ENTRYPOINT, CMD, EXPOSE and COPY --from lines
# ---------------------------------------------------------------------------------------------


def dockerfile_instructions(path):
    """(line number, INSTRUCTION, rest) of each instruction of a Dockerfile, continuations joined."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        start = i + 1
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.rstrip().endswith("\\"):
            line = line.rstrip()[:-1]
            # Comment lines inside a continuation are dropped, as BuildKit does.
            while i < len(lines) and lines[i].lstrip().startswith("#"):
                i += 1
            if i >= len(lines):
                raise ImageError(f"{path}:{start}: the line continues (\\) past the end of the file")
            line += " " + lines[i].strip()
            i += 1
        word, _, rest = line.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def exec_form(path, lineno, word, rest):
    """The JSON array of an exec-form ENTRYPOINT/CMD; the shell form is an error."""
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ImageError(
            f"{path}:{lineno}: {word} must be a non-empty JSON array of strings (exec form), got: {rest}"
        )
    return value


def parse_dockerfile(path):
    """What the final stage of a Dockerfile says about the image, as a dict (see `dockerfile`)."""
    instructions = dockerfile_instructions(path)
    stages = set()
    final_start = None
    for idx, (lineno, word, rest) in enumerate(instructions):
        if word == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+[Aa][Ss]\s+(\S+))?", rest)
            if not m:
                raise ImageError(f"{path}:{lineno}: FROM must be `FROM IMAGE [AS NAME]`, got: {rest}")
            if m.group(2):
                stages.add(m.group(2))
            final_start = idx
    if final_start is None:
        raise ImageError(f"{path}: no FROM line: not a Dockerfile")
    spec = {"base": instructions[final_start][2].split()[0], "user": None, "entrypoint": None,
            "cmd": None, "exposed_ports": [], "copies": []}
    cmd_set = False
    for lineno, word, rest in instructions[final_start + 1:]:
        if word not in FINAL_STAGE_INSTRUCTIONS:
            raise ImageError(
                f"{path}:{lineno}: the final stage uses {word}, which mkimage.py does not reproduce "
                f"(allowed there: {', '.join(sorted(FINAL_STAGE_INSTRUCTIONS - {'FROM'}))})"
            )
        if word == "USER":
            if not re.fullmatch(r"[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?", rest):
                raise ImageError(f"{path}:{lineno}: USER must be `USER NAME|UID[:GROUP|GID]`, got: {rest}")
            spec["user"] = rest
        elif word in ("ENTRYPOINT", "CMD"):
            spec[word.lower()] = exec_form(path, lineno, word, rest)
            cmd_set = cmd_set or word == "CMD"
            if word == "ENTRYPOINT" and not cmd_set:
                spec["cmd"] = None  # ENTRYPOINT resets a CMD the stage did not set (BuildKit's rule)
        elif word == "EXPOSE":
            for port in rest.split():
                if not re.fullmatch(r"\d+(/(tcp|udp|sctp))?", port):
                    raise ImageError(f"{path}:{lineno}: EXPOSE takes PORT[/tcp|udp|sctp], got: {port}")
                spec["exposed_ports"].append(port if "/" in port else port + "/tcp")
        elif word == "COPY":
            spec["copies"].extend(parse_copy(path, lineno, rest, stages))
    # The base image's own ENTRYPOINT and USER are unknown without a registry: say them explicitly.
    if spec["entrypoint"] is None:
        raise ImageError(f"{path}: the final stage has no ENTRYPOINT (it must not rely on the base image's)")
    if spec["user"] is None:
        raise ImageError(f"{path}: the final stage has no USER (it must not rely on the base image's)")
    if not spec["copies"]:
        raise ImageError(f"{path}: the final stage has no `COPY --from=<stage> /out/<bin> <dest>` line")
    return spec


def parse_copy(path, lineno, rest, stages):
    """The {source, dest} pairs of `COPY --from=<stage> /out/<bin>... <dest>` (dest/ = a folder)."""
    words = rest.split()
    flags = [w for w in words if w.startswith("--")]
    args = [w for w in words if not w.startswith("--")]
    rule = "COPY must be `COPY --from=<build stage> /out/<bin>... <absolute dest>`"
    if len(flags) != 1 or not flags[0].startswith("--from=") or len(args) < 2 or rest.startswith("["):
        raise ImageError(f"{path}:{lineno}: {rule}, got: COPY {rest}")
    stage = flags[0][len("--from="):]
    if stage not in stages:
        raise ImageError(f"{path}:{lineno}: COPY --from={stage} names no `FROM ... AS {stage}` stage of the file")
    *sources, dest = args
    if not dest.startswith("/"):
        raise ImageError(f"{path}:{lineno}: {rule}; the destination {dest} is not absolute")
    for src in sources:
        if not re.fullmatch(r"/out/[A-Za-z0-9_.-]+", src):
            raise ImageError(f"{path}:{lineno}: {rule}; the source {src} is not /out/<bin>")
    if not dest.endswith("/") and len(sources) > 1:
        raise ImageError(f"{path}:{lineno}: COPY with several sources needs a destination folder ending in /")
    copies = []
    for src in sources:
        name = src[len("/out/"):]
        copies.append({"source": src, "binary": name, "dest": dest + name if dest.endswith("/") else dest})
    return copies


# ---------------------------------------------------------------------------------------------
# ELF: interpreter, DT_NEEDED, RPATH/RUNPATH (64-bit little-endian only)
# ---------------------------------------------------------------------------------------------

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 1, 5, 10, 15, 29


def elf_dynamic_info(f):
    """(interpreter, [needed], [rpath dirs]) of an ELF file object, or None when it is not ELF."""
    f.seek(0)
    head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return None
    if head[4] != 2 or head[5] != 1:
        raise ImageError("only 64-bit little-endian ELF files are supported")
    phoff, = struct.unpack_from("<Q", head, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    loads, dynamic, interp = [], None, None
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
        elif p_type == PT_INTERP:
            f.seek(p_offset)
            interp = f.read(p_filesz).rstrip(b"\0").decode()
    if dynamic is None:
        return interp, [], []
    f.seek(dynamic[0])
    raw = f.read(dynamic[1])
    entries = [struct.unpack_from("<qQ", raw, o) for o in range(0, len(raw) - 15, 16)]
    strtab = next((v for t, v in entries if t == DT_STRTAB), None)
    if strtab is None:
        return interp, [], []
    strtab_off = next((off + strtab - va for va, off, sz in loads if va <= strtab < va + sz), None)
    if strtab_off is None:
        raise ImageError("DT_STRTAB lies in no PT_LOAD segment")

    def string(offset):
        f.seek(strtab_off + offset)
        data = b""
        while b"\0" not in data:
            chunk = f.read(256)
            if not chunk:
                break
            data += chunk
        return data.split(b"\0", 1)[0].decode()

    needed = [string(v) for t, v in entries if t == DT_NEEDED]
    runpath = [string(v) for t, v in entries if t == DT_RUNPATH]
    rpath = [] if runpath else [string(v) for t, v in entries if t == DT_RPATH]
    dirs = [d for p in runpath + rpath for d in p.split(":") if d]
    return interp, needed, dirs


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------


def ldd_paths(binary):
    """Absolute paths (as ldd prints them) of the interpreter and every library `binary` loads."""
    proc = subprocess.run(["ldd", binary], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        if "not a dynamic executable" in text or "statically linked" in text:
            return []
        raise ImageError(f"ldd {binary} failed: {text.strip()}")
    paths = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if "=> not found" in line:
            raise ImageError(f"ldd {binary}: {line.split()[0]} not found on this machine")
        m = re.match(r"(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)$", line)
        if m:
            paths.append(m.group(1))
        elif line and not line.startswith("linux-vdso") and not line.startswith("statically"):
            raise ImageError(f"ldd {binary}: cannot parse the line: {line}")
    return paths


def sha256_file(path):
    """Hex SHA-256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tar_info(name, kind, mode, size=0, uid=0):
    """A deterministic tar header: mtime 0, owner uid:uid (0:0 unless given), no user names."""
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = uid
    info.uname = info.gname = ""
    return info


def write_layer(layer, files, dirs, texts):
    """Writes the rootfs tar: `files` {dest: (src, mode)}, `dirs` {path: (mode, uid)}, `texts` {dest: str}."""
    entries = {}
    for path, (mode, uid) in dirs.items():
        entries[path] = ("dir", mode, uid, None)
    for path, (src, mode) in list(files.items()) + [(p, (t, 0o644)) for p, t in texts.items()]:
        entries[path] = ("file", mode, 0, src)
    for path in list(entries):
        parent = os.path.dirname(path)
        while parent != "/" and parent not in entries:
            entries[parent] = ("dir", 0o755, 0, None)
            parent = os.path.dirname(parent)
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(entries, key=lambda p: p.split("/")):
            kind, mode, uid, src = entries[path]
            if kind == "dir":
                tar.addfile(tar_info(path, tarfile.DIRTYPE, mode, uid=uid))
            elif path in texts:
                data = src.encode()
                tar.addfile(tar_info(path, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
            else:
                with open(src, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    tar.addfile(tar_info(path, tarfile.REGTYPE, mode, size), f)


def image_spec(args):
    """The image to build, as a dict: ref, binaries {dest: src}, entrypoint, cmd, user, ports,
    labels {key: value} and created (RFC 3339, UTC)."""
    spec = {"ref": args.ref, "binaries": {}, "entrypoint": None, "cmd": None, "user": None,
            "exposed_ports": [], "labels": {}, "created": CREATED}
    for label in args.label:
        key, sep, value = label.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", key):
            raise ImageError(f"--label {label}: expected KEY=VALUE with a key of letters, digits, '.', '_', '/', '-'")
        if key in spec["labels"]:
            raise ImageError(f"--label {key} is given twice")
        spec["labels"][key] = value
    if args.created is not None:
        if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", args.created):
            raise ImageError(f"--created {args.created}: expected YYYY-MM-DDTHH:MM:SSZ (RFC 3339, UTC)")
        spec["created"] = args.created
    if args.dockerfile:
        if not args.bin_dir:
            raise ImageError("--dockerfile needs --bin-dir (where /out/<bin> comes from)")
        if args.entrypoint or args.cmd or args.user:
            raise ImageError(f"--entrypoint/--cmd/--user are refused with --dockerfile: {args.dockerfile} says them")
        df = parse_dockerfile(args.dockerfile)
        for copy in df["copies"]:
            spec["binaries"][copy["dest"]] = os.path.join(args.bin_dir, copy["binary"])
        for key in ("entrypoint", "cmd", "user", "exposed_ports"):
            spec[key] = df[key]
    for add in args.add:
        src, sep, dest = add.rpartition(":")
        if not sep or not src or not dest.startswith("/"):
            raise ImageError(f"--add {add}: expected SRC:DEST with an absolute DEST")
        spec["binaries"][dest] = src
    if args.entrypoint:
        spec["entrypoint"] = json.loads(args.entrypoint)
    if args.cmd:
        spec["cmd"] = json.loads(args.cmd)
    if args.user:
        spec["user"] = args.user
    if not spec["binaries"]:
        raise ImageError(f"{args.ref}: no binaries (give --dockerfile or --add)")
    if not spec["entrypoint"]:
        raise ImageError(f"{args.ref}: no entrypoint (give --entrypoint or a Dockerfile with ENTRYPOINT)")
    for dest, src in spec["binaries"].items():
        if not os.path.isfile(src):
            raise ImageError(f"{args.ref}: {src} (for {dest}) does not exist: build it first")
    return spec


def cmd_build(args):
    """`build`: writes the docker-archive tarball unless its inputs are unchanged."""
    spec = image_spec(args)
    files = {}
    for dest, src in sorted(spec["binaries"].items()):
        files[dest] = (src, 0o755)
        for lib in ldd_paths(src):
            files.setdefault(lib, (os.path.realpath(lib), os.stat(lib).st_mode & 0o777))
    for src in args.libs_of:
        if not os.path.isfile(src):
            raise ImageError(f"{args.ref}: {src} (--libs-of) does not exist: build it first")
        for lib in ldd_paths(src):
            files.setdefault(lib, (os.path.realpath(lib), os.stat(lib).st_mode & 0o777))
    with open(os.path.abspath(__file__), "rb") as f:
        builder = hashlib.sha256(f.read()).hexdigest()
    inputs = {
        "builder": builder,
        "spec": {k: v for k, v in spec.items() if k != "binaries"},
        "files": {dest: [src, mode, sha256_file(src)] for dest, (src, mode) in sorted(files.items())},
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    stamp = args.out + ".inputs"
    if os.path.isfile(args.out) and os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as f:
            if f.read().strip() == digest:
                print(f"{args.ref}\t{args.out}\t{os.path.getsize(args.out)}\tunchanged")
                return
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    dirs = {path: (mode, uid) for path, mode, uid in BASE_DIRS}
    texts = {"/etc/passwd": PASSWD, "/etc/group": GROUP}
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".mkimage-") as tmp:
        layer_path = os.path.join(tmp, "layer.tar")
        with open(layer_path, "wb") as layer:
            write_layer(layer, files, dirs, texts)
        diff_id = sha256_file(layer_path)
        config = {
            "architecture": host_architecture(),
            "os": "linux",
            "created": spec["created"],
            "config": {"Env": [PATH_ENV], "Entrypoint": spec["entrypoint"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
            "history": [{"created": spec["created"], "created_by": "tests/harness/mkimage.py " + spec["ref"]}],
        }
        if spec["labels"]:
            config["config"]["Labels"] = dict(sorted(spec["labels"].items()))
        if spec["cmd"]:
            config["config"]["Cmd"] = spec["cmd"]
        if spec["user"]:
            config["config"]["User"] = spec["user"]
        if spec["exposed_ports"]:
            config["config"]["ExposedPorts"] = {p: {} for p in spec["exposed_ports"]}
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
        manifest = [{"Config": config_name, "RepoTags": [spec["ref"]], "Layers": [diff_id + "/layer.tar"]}]
        manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
        tmp_out = os.path.join(tmp, "image.tar")
        with tarfile.open(tmp_out, mode="w", format=tarfile.GNU_FORMAT) as tar:
            tar.addfile(tar_info(config_name, tarfile.REGTYPE, 0o644, len(config_bytes)), io.BytesIO(config_bytes))
            tar.addfile(tar_info(diff_id, tarfile.DIRTYPE, 0o755))
            with open(layer_path, "rb") as layer:
                size = os.fstat(layer.fileno()).st_size
                tar.addfile(tar_info(diff_id + "/layer.tar", tarfile.REGTYPE, 0o644, size), layer)
            tar.addfile(tar_info("manifest.json", tarfile.REGTYPE, 0o644, len(manifest_bytes)),
                        io.BytesIO(manifest_bytes))
        os.replace(tmp_out, args.out)
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(digest + "\n")
    print(f"{args.ref}\t{args.out}\t{os.path.getsize(args.out)}\tbuilt")


# ---------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------


class Rootfs:
    """The merged view of an image's layers (regular files, dirs, symlinks) for path lookups."""

    def __init__(self):
        self.entries = {}  # "/abs/path" -> (TarInfo, layer tarfile)

    def add_layer(self, layer):
        """Applies one layer on top (whiteouts remove the path they name)."""
        for info in layer.getmembers():
            path = os.path.normpath("/" + info.name)
            base = os.path.basename(path)
            if base.startswith(".wh."):
                gone = os.path.join(os.path.dirname(path), base[len(".wh."):])
                self.entries = {p: e for p, e in self.entries.items() if p != gone and not p.startswith(gone + "/")}
                continue
            self.entries[path] = (info, layer)

    def resolve(self, path, hops=0):
        """The path with every symlink component followed inside the image, or None if it is absent."""
        if hops > 40:
            return None
        parts = [p for p in path.split("/") if p]
        current = "/"
        for i, part in enumerate(parts):
            candidate = os.path.join(current, part)
            entry = self.entries.get(candidate)
            if entry is None:
                if i + 1 < len(parts):  # a layer may leave a parent folder implicit
                    current = candidate
                    continue
                return None
            info = entry[0]
            if info.issym():
                target = info.linkname if info.linkname.startswith("/") else os.path.join(current, info.linkname)
                rest = "/".join(parts[i + 1:])
                return self.resolve(os.path.normpath(os.path.join(target, rest)), hops + 1)
            current = candidate
        return current

    def has_file(self, path):
        """Whether `path` (symlinks followed) is a regular file of the image."""
        real = self.resolve(path)
        return real is not None and self.entries[real][0].isreg()

    def open(self, path):
        """A seekable file object of a regular file at `path` (symlinks followed), or None."""
        real = self.resolve(path)
        entry = self.entries.get(real) if real else None
        if entry is None or not entry[0].isreg():
            return None
        return entry[1].extractfile(entry[0])


def library_closure(rootfs, exe):
    """{interpreter, needed, missing} of an executable in the image: DT_NEEDED followed transitively."""
    with rootfs.open(exe) as f:
        info = elf_dynamic_info(f)
    interp, needed, rpath = info
    missing = []
    if interp and not rootfs.has_file(interp):
        missing.append(interp)
    seen, found_all = [], []
    queue = [(lib, exe, rpath) for lib in needed]
    while queue:
        lib, by, dirs = queue.pop(0)
        if lib in seen:
            continue
        seen.append(lib)
        origin = os.path.dirname(by)
        search = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in dirs] + DEFAULT_LIB_DIRS
        hit = next((os.path.join(d, lib) for d in search if rootfs.has_file(os.path.join(d, lib))), None)
        if hit is None:
            missing.append(f"{lib} (needed by {by})")
            continue
        found_all.append(hit)
        with rootfs.open(hit) as f:
            sub = elf_dynamic_info(f)
        if sub is None:
            missing.append(f"{hit} is not ELF (needed by {by})")
            continue
        queue.extend((s, hit, sub[2]) for s in sub[1])
    return {"interpreter": interp, "needed": seen, "resolved": found_all, "missing": missing}


def cmd_inspect(args):
    """`inspect`: prints the image's config, paths and library closure as JSON."""
    with tarfile.open(args.tar, mode="r:") as outer:
        names = outer.getnames()
        if "manifest.json" not in names:
            raise ImageError(f"{args.tar}: no manifest.json: not a docker-archive (docker save) tarball")
        manifest = json.load(outer.extractfile("manifest.json"))
        if len(manifest) != 1:
            raise ImageError(f"{args.tar}: manifest.json lists {len(manifest)} images, expected 1")
        config = json.load(outer.extractfile(manifest[0]["Config"]))
        rootfs = Rootfs()
        layers = []
        for name in manifest[0]["Layers"]:
            layer = tarfile.open(fileobj=outer.extractfile(name), mode="r:")
            layers.append(layer)
            rootfs.add_layer(layer)
        files = {}
        for path, (info, _layer) in sorted(rootfs.entries.items()):
            kind = "dir" if info.isdir() else "symlink" if info.issym() else "file" if info.isreg() else "other"
            files[path] = {"type": kind, "mode": info.mode, "uid": info.uid, "gid": info.gid, "size": info.size}
            if info.issym():
                files[path]["target"] = info.linkname
        executables = {}
        for path, meta in files.items():
            if meta["type"] != "file" or not meta["mode"] & 0o111:
                continue
            with rootfs.open(path) as f:
                info = elf_dynamic_info(f)
            if info is not None and info[0] is not None:
                executables[path] = library_closure(rootfs, path)
        report = {
            "repo_tags": manifest[0].get("RepoTags") or [],
            "architecture": config.get("architecture"),
            "os": config.get("os"),
            "created": config.get("created"),
            "config": config.get("config", {}),
            "layers": len(manifest[0]["Layers"]),
            "files": files,
            "executables": executables,
        }
        for layer in layers:
            layer.close()
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


def host_architecture():
    """The OCI architecture name (amd64, arm64) of this machine; exits naming an unknown one."""
    machine = os.uname().machine
    if machine not in ARCHITECTURES:
        sys.exit(f"mkimage.py: no OCI architecture name for this machine's {machine!r} (known: {sorted(ARCHITECTURES)})")
    return ARCHITECTURES[machine]


def main():
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Build and inspect docker-archive images (see the module doc).")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a docker-archive tarball")
    build.add_argument("--ref", required=True, help="image reference, e.g. localhost/aether/aether-agent:dev")
    build.add_argument("--out", required=True, help="tarball to write")
    build.add_argument("--dockerfile", help="take binaries, USER, ENTRYPOINT, CMD, EXPOSE from its final stage")
    build.add_argument("--bin-dir", help="where the Dockerfile's /out/<bin> files are (e.g. target/debug)")
    build.add_argument("--add", action="append", default=[], metavar="SRC:DEST", help="add a binary")
    build.add_argument("--libs-of", action="append", default=[], metavar="SRC",
                       help="add the shared libraries SRC needs, not SRC itself")
    build.add_argument("--entrypoint", help="JSON array")
    build.add_argument("--cmd", help="JSON array")
    build.add_argument("--user", help="USER of the image config, e.g. 65532:65532")
    build.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                       help="a label of the image config (config.Labels)")
    build.add_argument("--created", help="the config's created time, YYYY-MM-DDTHH:MM:SSZ (default: the epoch)")
    dockerfile = sub.add_parser("dockerfile", help="print what a Dockerfile's final stage says, as JSON")
    dockerfile.add_argument("file")
    inspect = sub.add_parser("inspect", help="print an image tarball's config, paths and libraries, as JSON")
    inspect.add_argument("tar")
    args = parser.parse_args()
    try:
        if args.command == "build":
            cmd_build(args)
        elif args.command == "dockerfile":
            json.dump(parse_dockerfile(args.file), sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            cmd_inspect(args)
    except ImageError as e:
        sys.exit(f"mkimage: error: {e}")


if __name__ == "__main__":
    main()
