#!/usr/bin/env python3
"""runc, minus the capabilities this host cannot grant: the CRI-O lane's runtime_path on a host
whose capability bounding set lacks some (this machine runs inside a sandbox without
CAP_SYS_RESOURCE).

CRI-O gives a privileged container every capability the kernel knows (runtime-tools'
SetupPrivileged) and runc refuses to start it when one is outside its own bounding set ("unable
to apply caps: operation not permitted"); containerd gives a privileged container the caps its
own process holds (WithAllCurrentCapabilities), so it never meets this. On a host with a full
bounding set (every usual node) this wrapper changes nothing; tests/harness/crio-lib.sh uses it
only where the set is incomplete.

For `runc create|run --bundle DIR` it rewrites DIR/config.json's process.capabilities, for
`runc exec --process FILE` FILE's capabilities, keeping only the capabilities in this process's
CapBnd (/proc/self/status; capability numbers as in linux/capability.h), then execs the real
runc (RUNC_CAPS_REAL, an absolute path) with the same arguments.
"""
import json
import os
import sys

# linux/capability.h, by number.
CAPS = [
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
]


def bounding():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                mask = int(line.split()[1], 16)
                return {"CAP_" + n for i, n in enumerate(CAPS) if mask >> i & 1}
    return None


def value(args, *names):
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return None


def filter_caps(caps, allowed):
    if not isinstance(caps, dict):
        return False
    changed = False
    for kind, names in caps.items():
        if isinstance(names, list):
            kept = [c for c in names if c in allowed]
            changed |= kept != names
            caps[kind] = kept
    return changed


def rewrite(path, allowed, key_path):
    with open(path) as f:
        doc = json.load(f)
    node = doc
    for k in key_path[:-1]:
        node = node.get(k) or {}
    if filter_caps(node.get(key_path[-1]), allowed):
        tmp = path + ".caps-tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)


def main():
    real = os.environ.get("RUNC_CAPS_REAL", "")
    if not os.path.isabs(real):
        sys.exit("runc-caps: RUNC_CAPS_REAL must name the real runc by its absolute path")
    args = sys.argv[1:]
    allowed = bounding()
    verbs = [a for a in args if a in ("create", "run", "exec")]
    if allowed is not None and verbs:
        if verbs[0] in ("create", "run"):
            bundle = value(args, "--bundle", "-b") or "."
            rewrite(os.path.join(bundle, "config.json"), allowed, ["process", "capabilities"])
        else:
            process = value(args, "--process", "-p")
            if process:
                rewrite(process, allowed, ["capabilities"])
    os.execv(real, [real] + args)


if __name__ == "__main__":
    main()
