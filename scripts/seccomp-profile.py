#!/usr/bin/env python3
"""Writes the relay's seccomp profile for Kubernetes (k8s/components/mip-sandbox/relay-seccomp.json).

The MIP sandbox's bubblewrap needs clone/unshare with namespace flags, mount, pivot_root and
umount2 inside the user namespace it creates. The runtimes' default profiles (containerd's
and Docker's, derived from moby's) allow those only to containers with CAP_SYS_ADMIN, so the
sandbox cannot start under `RuntimeDefault`. podman's default profile (containers-common,
Apache-2.0) allows them to every container and leaves the checks to the kernel, which only
permits them inside a user namespace the process owns.

This takes podman's profile as installed by Debian's golang-github-containers-common
(/usr/share/containers/seccomp.json) and resolves it for the relay container: its
capabilities (SETUID, SETGID, KILL and nothing else), x86_64 and aarch64. The result is in
the OCI runtime format (no capability conditions) that containerd and CRI-O both read from
the kubelet's seccomp directory.

    scripts/seccomp-profile.py [SOURCE] > k8s/components/mip-sandbox/relay-seccomp.json
"""

import json
import sys

CAPABILITIES = {"CAP_SETUID", "CAP_SETGID", "CAP_KILL"}
# podman's names for the architectures kept (Go's GOARCH), and libseccomp's.
ARCHES = {"amd64", "x32", "386", "arm64", "arm"}
ARCH_MAP = {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"}


def applies(rule):
    includes = rule.get("includes") or {}
    excludes = rule.get("excludes") or {}
    if not set(includes.get("caps") or []) <= CAPABILITIES:
        return False
    if includes.get("arches") and not set(includes["arches"]) & ARCHES:
        return False
    if set(excludes.get("caps") or []) & CAPABILITIES:
        return False
    if excludes.get("arches") and set(excludes["arches"]) >= ARCHES:
        return False
    return True


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/containers/seccomp.json"
    with open(source, encoding="utf-8") as file:
        podman = json.load(file)
    architectures = []
    for entry in podman["archMap"]:
        if entry["architecture"] in ARCH_MAP:
            architectures.append(entry["architecture"])
            architectures.extend(entry.get("subArchitectures") or [])
    syscalls = []
    for rule in podman["syscalls"]:
        if not applies(rule):
            continue
        kept = {"names": sorted(rule["names"]), "action": rule["action"]}
        if rule.get("args"):
            kept["args"] = rule["args"]
        if "errnoRet" in rule:
            kept["errnoRet"] = rule["errnoRet"]
        syscalls.append(kept)
    # podman lists some calls (setns, …) as allowed and, for containers without the
    # capability, as refused too; its intent is the refusal: say only that.
    refused = {
        name
        for rule in syscalls
        if rule["action"] != "SCMP_ACT_ALLOW" and "args" not in rule
        for name in rule["names"]
    }
    for rule in syscalls:
        if rule["action"] == "SCMP_ACT_ALLOW" and "args" not in rule:
            rule["names"] = [name for name in rule["names"] if name not in refused]
    profile = {
        "defaultAction": podman["defaultAction"],
        "defaultErrnoRet": podman.get("defaultErrnoRet", 1),
        "architectures": architectures,
        "syscalls": syscalls,
    }
    json.dump(profile, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
