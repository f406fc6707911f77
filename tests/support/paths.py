"""Where the tests' data lives: this repo, the shared corpus beside it, small corpora."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


SHARED = REPO.parent / "shared" / "corpus"


SAMPLE = REPO / "data" / "sample"


def shared_pdf(name: str) -> Path:
    """A PDF of the shared corpus (tests fail loudly if shared/ is missing)."""
    for folder in ("pdf", "rdocs"):
        path = SHARED / folder / name
        if path.is_file():
            return path
    raise FileNotFoundError(f"{name} not in {SHARED}; the shared corpus must sit beside the repo")


QUERY_CORPUS = {
    "science/photosynthesis.md": """# Photosynthesis

## Light reactions
Plants capture sunlight with chlorophyll in the thylakoid membranes. The light reactions split
water, release oxygen and store energy as ATP and NADPH.

## Calvin cycle
In the stroma the Calvin cycle fixes carbon dioxide into sugar. The enzyme RuBisCO attaches
carbon dioxide to ribulose bisphosphate; ATP and NADPH from the light reactions drive it.
""",
    "history/computing.md": """# Early computing

## Ada Lovelace
Ada Lovelace wrote the first published program for Charles Babbage's Analytical Engine in 1843.
Her notes describe how the engine could compute Bernoulli numbers.

## Alan Turing
Alan Turing described a universal machine in 1936 and worked on breaking the Enigma cipher at
Bletchley Park during the Second World War.
""",
    "kitchen/bread.md": """# Baking bread

## Dough
Mix flour, water, salt and yeast. Knead the dough for ten minutes until it is smooth and
elastic, then let it rise for an hour in a warm place.

## Oven
Bake the loaf at 230 degrees Celsius for thirty-five minutes. A tray of water in the oven
gives the crust steam and makes it crisp.
""",
    "ops/backups.md": """# Database backups

## Schedule
Take a full backup of the database every night at two o'clock and keep the last fourteen
copies. Incremental backups run every hour.

## Restore
To restore, stop the service, copy the latest full backup into place, replay the incremental
backups in order and start the service again. Test a restore every month.
""",
    "ops/backups-copy.md": """# Database backups

## Schedule
Take a full backup of the database every night at two o'clock and keep the last fourteen
copies. Incremental backups run every hour.
""",
}
