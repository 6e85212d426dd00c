"""The kubelet's AtomicWriter sequence for one-key ConfigMap volumes, with the
moment of the commit (the rename of ..data) returned for latency figures."""
import os
import shutil
import tempfile
import time


def project(target, files):
    """Projects {key: text} into target; returns monotonic_ns() just before the rename."""
    os.makedirs(target, exist_ok=True)
    data = os.path.join(target, "..data")
    old = os.readlink(data) if os.path.islink(data) else None
    ts = tempfile.mkdtemp(prefix=time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()), dir=target)
    os.chmod(ts, 0o755)
    for key, text in files.items():
        with open(os.path.join(ts, key), "w") as f:
            f.write(text)
    tmp = os.path.join(target, "..data_tmp")
    os.symlink(os.path.basename(ts), tmp)
    t0 = time.monotonic_ns()
    os.rename(tmp, data)
    for key in files:
        visible = os.path.join(target, key)
        if not os.path.lexists(visible):
            os.symlink(os.path.join("..data", key), visible)
    if old:
        shutil.rmtree(os.path.join(target, old), ignore_errors=True)
    return t0
