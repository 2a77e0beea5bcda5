"""The committed example notebooks carry no outputs and no execution counts (git keeps them stripped:
what a run printed belongs to that run), and read their configuration from the environment."""

from pathlib import Path

import nbformat

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_committed_notebooks_are_stripped_of_outputs():
    notebooks = sorted(EXAMPLES.glob("*.ipynb"))
    assert len(notebooks) == 3
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: a cell has outputs"
        assert "os.environ.get(" in nb.cells[1].source, f"{path.name}: its config cell reads no environment"
