"""Rebuild data/corpus/{train,val}.txt from Debian's r-cran-janeaustenr package.

    apt-get download r-cran-janeaustenr && dpkg -x r-cran-janeaustenr_*.deb pkg
    pip install rdata
    python3 data/extract_austen.py pkg/usr/lib/R/site-library/janeaustenr/data data/corpus

The package stores each novel as a character vector (one element per line) in R's lazy-load
database: Rdata.rdx (gzip) maps names to (offset, length) in Rdata.rdb, whose records are a
4-byte big-endian length followed by zlib data.
"""

import gzip
import struct
import sys
import zlib
from pathlib import Path

import rdata

TRAIN = ["sensesensibility", "prideprejudice", "emma", "persuasion"]
VAL = "northangerabbey"
VAL_END = "CHAPTER 16"  # validation: Northanger Abbey up to the end of chapter 15 (volume I)


def novels(data_dir: Path) -> dict:
    parse = lambda raw: rdata.conversion.convert(rdata.parser.parse_data(raw))
    index = parse(gzip.decompress((data_dir / "Rdata.rdx").read_bytes()))["variables"]
    db = (data_dir / "Rdata.rdb").read_bytes()
    out = {}
    for name, (offset, length) in index.items():
        record = db[offset : offset + length]
        raw = zlib.decompress(record[4:])
        assert len(raw) == struct.unpack(">I", record[:4])[0]
        out[str(name)] = "\n".join(str(line) for line in parse(raw)).strip() + "\n"
    return out


def main(data_dir: str, out_dir: str) -> None:
    books = novels(Path(data_dir))
    out = Path(out_dir)
    # Books are documents: GPT-2's separator between them (see `pipetrain tokenize`).
    (out / "train.txt").write_text("<|endoftext|>".join(books[b] for b in TRAIN))
    val = books[VAL]
    (out / "val.txt").write_text(val[: val.index(VAL_END)].rstrip() + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
