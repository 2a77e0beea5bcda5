"""Builds the WordNet that nltk's meteor reads, at install, from Debian's `wordnet-base`.

nltk's `wordnet` corpus is Princeton WordNet 3.0's database directory, which nltk would otherwise
download at run time (it cannot here). Debian's `wordnet-base` ships the same 3.0 database under
/usr/share/wordnet (`wordnet-sense-index` adds its index.sense, which nltk's reader opens at
start), less one small file: `lexnames`, the table of lexicographer file numbers and
names, which Debian's library compiles in and documents in its lexnames(5WN) man page (shipped by
the same package). This writes `<prefix>/share/nltk_data/corpora/wordnet/`, a directory nltk
searches by default (`sys.prefix/share/nltk_data`): copies of the database files (nltk refuses
links that leave its data directory) and `lexnames` built from the man page's table. Run by `make` after the venv is installed:

    python -m graders.wordnet_data [--source /usr/share/wordnet] [--target DIR]
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import sys
from pathlib import Path

SOURCE = Path("/usr/share/wordnet")
MAN_PAGE = Path("/usr/share/man/man5/lexnames.5WN.gz")
DATABASE = [f"{kind}.{pos}" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv")] + [
    f"{pos}.exc" for pos in ("noun", "verb", "adj", "adv")] + ["index.sense"]
_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
_ROW = re.compile(r"^(\d\d)\t([a-z]+)\.([A-Za-z]+)\s*\t")


def lexnames(man_page: Path) -> str:
    """lexnames' lines (`NN<TAB>pos.name<TAB>category`) from the man page's table."""
    text = gzip.decompress(man_page.read_bytes()).decode()
    rows = [m for m in map(_ROW.match, text.splitlines()) if m]
    if [int(m[1]) for m in rows] != list(range(len(rows))) or len(rows) < 45:
        raise SystemExit(f"{man_page}: its table of lexicographer files is not the 45 rows expected")
    return "".join(f"{m[1]}\t{m[2]}.{m[3]}\t{_CATEGORY[m[2]]}\n" for m in rows)


def build(source: Path, target: Path, man_page: Path = MAN_PAGE) -> Path:
    missing = [name for name in DATABASE if not (source / name).is_file()]
    if missing or not man_page.is_file():
        raise SystemExit(f"WordNet 3.0 is not installed under {source}: apt-get install wordnet-base")
    target.mkdir(parents=True, exist_ok=True)
    for name in DATABASE:
        shutil.copyfile(source / name, target / name)
    (target / "lexnames").write_text(lexnames(man_page))
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--target", type=Path, default=Path(sys.prefix) / "share" / "nltk_data" / "corpora" / "wordnet")
    args = parser.parse_args(argv)
    print(f"WordNet for nltk: {build(args.source, args.target)}")


if __name__ == "__main__":
    main()
