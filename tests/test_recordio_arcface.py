"""arcface_torch's MXFaceDataset, changed only in its import and imdecode lines, in DataLoader
workers over rectool's packs: the same samples and labels as the same class through MXNet.

The class below is recognition/arcface_torch/dataset.py's `MXFaceDataset` (insightface), with
`mx.recordio.` written `recordio.` and the torchvision transform left out (it would run the
same on both sides). The two lines that change are the ones docs/migration.md gives.
"""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner
from helpers.mxnet_oracle import run_mxnet

pytestmark = pytest.mark.oracle

DATASET = """\
import numbers
import os

import numpy as np
import torch
from torch.utils.data import Dataset
{import_line}


class MXFaceDataset(Dataset):
    def __init__(self, root_dir, local_rank=0):
        super(MXFaceDataset, self).__init__()
        self.root_dir = root_dir
        self.local_rank = local_rank
        path_imgrec = os.path.join(root_dir, 'train.rec')
        path_imgidx = os.path.join(root_dir, 'train.idx')
        self.imgrec = recordio.MXIndexedRecordIO(path_imgidx, path_imgrec, 'r')
        s = self.imgrec.read_idx(0)
        header, _ = recordio.unpack(s)
        if header.flag > 0:
            self.header0 = (int(header.label[0]), int(header.label[1]))
            self.imgidx = np.array(range(1, int(header.label[0])))
        else:
            self.imgidx = np.array(list(self.imgrec.keys))

    def __getitem__(self, index):
        idx = self.imgidx[index]
        s = self.imgrec.read_idx(idx)
        header, img = recordio.unpack(s)
        label = header.label
        if not isinstance(label, numbers.Number):
            label = label[0]
        label = torch.tensor(label, dtype=torch.long)
        sample = {imdecode_line}
        return torch.from_numpy(sample), label

    def __len__(self):
        return len(self.imgidx)
"""
MXNET_LINES = {
    "import_line": "import mxnet as mx\nfrom mxnet import recordio",
    "imdecode_line": "mx.image.imdecode(img).asnumpy()",
}
RECTOOL_LINES = {
    "import_line": "from rectool import recordio",
    "imdecode_line": "recordio.imdecode(img)",
}

# MXNet's side runs without torch (its environment has none): a stub stands in for the three
# names the class uses, and the samples are taken in order in one process.
MX_SAMPLES = """
import sys, types
torch = types.ModuleType('torch')
torch.long = 'long'
torch.tensor = lambda value, dtype: int(value)
torch.from_numpy = lambda a: a
data = types.ModuleType('torch.utils.data')
data.Dataset = object
torch.utils = types.ModuleType('torch.utils')
torch.utils.data = data
sys.modules.update({'torch': torch, 'torch.utils': torch.utils, 'torch.utils.data': data})
namespace = {}
exec(DATA['source'], namespace)
out = {}
for root in DATA['roots']:
    ds = namespace['MXFaceDataset'](root)
    out[root] = [(a.shape, a.tobytes(), label) for a, label in (ds[i] for i in range(len(ds)))]
emit(out)
"""


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    from helpers.image_files import write_list, write_pack_tree

    from rectool.cli import cli

    base = tmp_path_factory.mktemp("arcface")
    items = write_pack_tree(base / "tree", ["alice", "bob", "carol", "dave"], 5)
    write_list(base / "faces.lst", items)
    roots = {}
    for layout in ("insightface", "images"):
        out = base / layout / "train"
        args = ["pack", str(base / "faces.lst"), str(base / "tree"), str(out), "--layout", layout]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        roots[layout] = str(out.parent)
    module = base / "module"
    module.mkdir()
    (module / "face_dataset.py").write_text(DATASET.format(**RECTOOL_LINES))
    sys.path.insert(0, str(module))
    source = DATASET.format(**MXNET_LINES)
    expected = run_mxnet(MX_SAMPLES, data={"source": source, "roots": list(roots.values())})
    yield roots, expected
    sys.path.remove(str(module))


@pytest.mark.parametrize(
    ("layout", "context", "workers"),
    [("insightface", "fork", 2), ("images", "fork", 2), ("images", "spawn", 1)],
)
def test_mxfacedataset_in_dataloader_workers_gives_mxnets_samples(packs, layout, context, workers):
    import torch
    from face_dataset import MXFaceDataset

    roots, expected = packs
    ds = MXFaceDataset(roots[layout])
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=workers, multiprocessing_context=context
    )
    got = []
    for samples, labels in loader:
        assert samples.dtype == torch.uint8 and labels.dtype == torch.int64
        got += [(tuple(s.shape), s.numpy().tobytes(), int(y)) for s, y in zip(samples, labels)]
    want = expected[roots[layout]]
    assert len(got) == len(want) == 20
    assert got == [(tuple(shape), pixels, label) for shape, pixels, label in want]
    assert sorted({label for *_, label in got}) == [0, 1, 2, 3]
