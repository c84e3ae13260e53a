"""Writes docs/spec.md's tables of aggregations and keys from the registries (the codec
and aggregation records in C++), between its spec-tables markers, so the docs cannot
drift from the code. `python scripts/spec_tables.py --check` exits 1 when they differ."""
import argparse
import pathlib
import sys

BEGIN, END = "<!-- spec-tables:begin (scripts/spec_tables.py writes this) -->", "<!-- spec-tables:end -->"
DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "spec.md"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def key_rows(keys) -> list:
    rows = ["| key | default | valid | meaning |", "|---|---|---|---|"]
    for key in keys:
        default = f"`{key['default']}`" if key["default"] else "—"
        rows.append(f"| `{key['name']}` | {default} | {cell(key['expects'])} | {cell(key['help'])} |")
    return rows


def tables() -> str:
    import gradzip
    from gradzip._extension import _C

    kinds = _C.aggregation_kinds()
    out = ["| name | keys | what `all_reduce` does |", "|---|---|---|"]
    for kind in kinds:
        names = ", ".join(f"`{k['name']}`" for k in kind["all_keys"]) or "—"
        if kind["name"] == "choco":
            names = ", ".join(f"`{k['name']}`" for k in kind["keys"]) + ", and the keys of the `compress` codec"
        out.append(f"| `{kind['name']}` | {names} | {cell(kind['summary'])} |")
    codec_kind = next(kind for kind in kinds if kind["codec"])
    own = {k["name"] for k in codec_kind["keys"]}
    out += ["", "Keys of every compressed aggregation (every codec name):", ""] + key_rows(codec_kind["keys"])
    for codec in _C.codec_kinds():
        if codec["keys"]:
            out += ["", f"Keys of `{codec['name']}`:", ""] + key_rows(codec["keys"])
    out += ["", "Keys of the model container (`gradzip.codec.compress_model`: a codec spec plus these):", ""]
    out += key_rows(_C.model_container_keys())
    for kind in kinds:
        if kind["decentralized"]:
            out += ["", f"Keys of `{kind['name']}`:", ""] + key_rows([k for k in kind["keys"] if k["name"] not in own
                                                                      or kind["name"] == "choco"])
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/spec.md differs instead of writing it")
    args = parser.parse_args()
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    updated = text[:start] + "\n" + tables() + "\n" + text[stop:]
    if args.check:
        if updated != text:
            print("docs/spec.md's tables differ from the registries: run python scripts/spec_tables.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
