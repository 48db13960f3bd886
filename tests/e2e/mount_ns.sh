# Sourced first by the storage-fault tests (fault_disk_full.sh, fault_stage_dir.sh): re-runs the
# calling script inside a private mount namespace, where it may mount small tmpfs file systems
# that vanish with it. Skips (77) where such a namespace cannot be made (not root, or no
# CAP_SYS_ADMIN), after a probe mount that proves it.
if [ -z "${KILTER_IN_MOUNT_NS:-}" ]; then
  probe=$(mktemp -d /tmp/kilter-mount-probe.XXXXXX)
  if ! unshare -m --propagation private mount -t tmpfs -o size=64k tmpfs "$probe" 2>/dev/null; then
    rmdir "$probe"
    echo "SKIP: cannot mount a tmpfs in a private mount namespace (unshare -m needs root / CAP_SYS_ADMIN)"
    exit 77
  fi
  rmdir "$probe"
  exec env KILTER_IN_MOUNT_NS=1 unshare -m --propagation private bash "$0" "$@"
fi
