"""funcnet.fileio: atomic writes."""

import numpy as np


def test_saved_files_get_the_usual_permissions(tmp_path):
    import os
    import stat
    from funcnet import checkpoint as ck

    ck.save(tmp_path, {"w": np.zeros(3, np.float32)}, 1)
    (path,) = [p for p in tmp_path.iterdir() if p.suffix == ".npz"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
