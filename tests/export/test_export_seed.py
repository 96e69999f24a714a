"""`itlbench export-model --seed`: a seed the engine cannot take is refused before a directory or file is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from itlbench.errors import ConfigError
from itlbench.export.gguf import export_gguf
from itlbench.export.hf import export_model


@pytest.mark.parametrize("seed", [-1, 2**64])
@pytest.mark.parametrize("export", [export_model, export_gguf], ids=["hf", "gguf"])
def test_a_seed_the_engine_cannot_take_is_refused_and_nothing_is_written(tmp_path: Path, seed: int,
                                                                         export: object) -> None:
    # was: 2**64 a ValueError traceback from torch's manual_seed, after the directory was made; -1 written, though
    # `itlbench run --seed -1` is refused, so the export could not be reproduced by the engine
    out = tmp_path / "new" / ("m.gguf" if export is export_gguf else "m")
    with pytest.raises(ConfigError) as err:
        export("tiny", out, seed=seed)  # type: ignore[operator]
    assert err.value.field == "--seed" and str(seed) in err.value.problem and err.value.fix
    assert not (tmp_path / "new").exists()
