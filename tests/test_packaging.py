"""The test extra carries every optional package a default-tier test needs, at the same pins as the
extra that offers it, so CI runs those tests instead of skipping them."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_test_extra_installs_the_cjk_and_neardup_packages_at_their_pins():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    test = set(extras["test"])
    for extra in ("cjk", "neardup"):
        missing = [req for req in extras[extra] if req not in test]
        assert not missing, f"the test extra lacks {missing} of the {extra} extra (or pins them differently)"
