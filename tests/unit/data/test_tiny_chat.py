import json
import subprocess
import sys
from pathlib import Path

from resilient_slurm.data.chat.dataset import resolve_path
from resilient_slurm.data.chat.format import parse_conversation
from resilient_slurm.data.chat.tiny import conversations

REPO = Path(__file__).resolve().parents[3]


def test_the_shipped_assets_are_what_the_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_chat"), "--out", str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    shipped = Path(resolve_path("asset:tiny_chat"))
    for name in ("chat.jsonl", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name
    model = lambda d: json.loads((d / "tokenizer.json").read_text())["model"]
    assert model(tmp_path)["vocab"] == model(shipped)["vocab"] and model(tmp_path)["merges"] == model(shipped)["merges"]
    assert (shipped / "chat.jsonl").stat().st_size < 2_000_000


def test_the_tasks_are_answered_correctly_and_every_format_occurs():
    kinds = set()
    for record in conversations(2000, seed=5):
        messages = parse_conversation(json.dumps(record))
        kinds.add("prompt" if "prompt" in record else "system" if messages[0]["role"] == "system" else "messages")
        kinds.add("multi-turn" if len(messages) > 3 else "single")
        user, answer = messages[-2]["content"], messages[-1]["content"]
        if user.startswith("Reverse: "):
            assert answer.split() == user.removeprefix("Reverse: ").split()[::-1]
        elif user.startswith("Sort: "):
            assert answer.split() == sorted(user.removeprefix("Sort: ").split())
        elif user.startswith("What is "):
            a, _, b = user.removeprefix("What is ").rstrip("?").split()
            assert answer == str(int(a) + int(b))
    assert kinds == {"prompt", "system", "messages", "multi-turn", "single"}
