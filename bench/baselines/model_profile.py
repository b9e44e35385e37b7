"""Model profiles (bench/models/<name>.txt): the per-tensor gradient shapes that gradex-bench replays.

Format, one tensor per line: "name dim [dim ...]" in the framework's parameter registration order;
'#' starts a comment line. The same files are compiled into gradex-bench, so both sides of a
comparison exchange exactly the same tensor list.
"""
import math
import pathlib

MODELS_DIR = pathlib.Path(__file__).resolve().parent.parent / "models"


class Profile:
    def __init__(self, name, tensors):
        self.name = name
        self.tensors = tensors  # [(name, shape tuple)]
        self.numels = [math.prod(shape) for _, shape in tensors]
        self.total_numel = sum(self.numels)


def load_profile(name_or_path):
    """A built-in profile by name (resnet50, bert_base, gpt2_small) or a profile file path.
    ValueError naming the file and line for a malformed entry."""
    path = pathlib.Path(name_or_path)
    if not path.suffix:
        path = MODELS_DIR / f"{name_or_path}.txt"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in MODELS_DIR.glob("*.txt")))
        raise ValueError(f"unknown model profile '{name_or_path}' (built in: {known})")
    tensors = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        try:
            shape = tuple(int(w) for w in words[1:])
        except ValueError:
            shape = ()
        if not shape or min(shape) <= 0:
            raise ValueError(f"{path}:{number}: expected 'name dim [dim ...]' with positive dims")
        tensors.append((words[0], shape))
    if not tensors:
        raise ValueError(f"{path}: no tensors")
    return Profile(path.stem, tensors)
