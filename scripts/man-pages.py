#!/usr/bin/env python3
"""Turns swift-argument-parser's generated pages into sandboxctl's man pages.

usage: man-pages.py GENERATED_DIR OUTPUT_DIR VERSION

generate-manual (the argument parser's own generator, run on the built sandboxctl) writes one mdoc page per
subcommand, named sandboxctl.lock.1, with the whole `--help` discussion in DESCRIPTION and a generic EXIT STATUS. This
gives the pages the shape man readers expect, without a second copy of any text:
- pages are named like git's, sandboxctl-lock(1), and cross-reference each other so;
- the `Environment:` and `Exit status:` blocks of the root command's discussion become the ENVIRONMENT and EXIT STATUS
  sections of every page (they hold for every subcommand);
- a blank line in a discussion becomes a paragraph break (.Pp), as roff ignores blank lines only with a warning;
- the page of the argument parser's `help` subcommand is dropped: `man` is that help;
- the footer names the release (`.Os sandboxctl VERSION`) instead of "BSD".
generate-manual has already escaped the text for roff, but guards a leading dot or apostrophe only at the start of a
whole discussion: every line of it gets that guard here.
"""
import pathlib
import sys

BLOCKS = ("Environment:", "Exit status:")


def page_name(generated_stem):
    return generated_stem.replace(".", "-")


def text_line(text):
    """A text line: a leading dot or apostrophe would make it a request."""
    return "\\&" + text if text[:1] in (".", "'") else text


def split_sections(lines):
    """The lines before the first .Sh, and each section as [title, lines]."""
    preamble, sections = [], []
    for line in lines:
        if line.startswith(".Sh "):
            sections.append([line[4:].strip('"'), []])
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    return preamble, sections


def split_discussion(body):
    """A DESCRIPTION's discussion (text up to the options' list) and the rest."""
    end = next((i for i, line in enumerate(body) if line.startswith(".Bl ")), len(body))
    return body[:end], body[end:]


def take_blocks(discussion):
    """The discussion without its `Environment:` and `Exit status:` blocks, and those as {name: [(term, text)]}.
    A block's entries are indented two spaces; deeper lines continue the entry above."""
    blocks, rest, current = {}, [], None
    for line in discussion:
        if line in BLOCKS:
            current = blocks.setdefault(line, [])
        elif current is not None and line.startswith("      ") and current:
            term, text = current[-1]
            current[-1] = (term, text + " " + line.strip())
        elif current is not None and line.startswith("  "):
            term, _, text = line.strip().partition(" ")
            current.append((term, text.strip()))
        else:
            current = None
            rest.append(line)
    return rest, blocks


def paragraphs(discussion):
    """Discussion text as mdoc: blank lines become .Pp, indented lines a literal display."""
    out = []
    for line in discussion:
        if not line.strip():
            if out and out[-1] != ".Pp":
                out.append(".Pp")
        elif line.startswith("  "):
            out += [".Bd -literal -offset indent", text_line(line.strip()), ".Ed"]
        else:
            out.append(text_line(line))
    while out and out[-1] == ".Pp":
        out.pop()
    return out


def tag_list(entries, term_macro):
    out = [".Bl -tag -width Ds"]
    for term, text in entries:
        out += [f".It {term_macro}{term}".rstrip(), text_line(text)]
    return out + [".El"]


def convert(stem, lines, environment, exit_status, version):
    preamble, sections = split_sections(lines)
    preamble = [f".Dt {page_name(stem).upper()} 1" if line.startswith(".Dt ") else
                f'.Os "sandboxctl {version}"' if line.startswith(".Os") else line for line in preamble]
    out = list(preamble)
    command = None
    see_also = []
    for title, body in sections:
        if title == "NAME":
            command = next(line[4:] for line in body if line.startswith(".Nm "))
            body = [f".Nm {page_name(stem)}" if line.startswith(".Nm ") else line for line in body]
            # Unquoted, so whatis and apropos show the summary without quotes.
            body = [".Nd " + line[5:-1] if line.startswith('.Nd "') and line.endswith('"') else line for line in body]
        elif title == "SYNOPSIS":
            body = [f".Nm {command}" if line == ".Nm" else line for line in body]
        elif title == "DESCRIPTION":
            discussion, options = split_discussion(body)
            discussion, _ = take_blocks(discussion)
            body = paragraphs(discussion) + options
        elif title == "EXIT STATUS":
            out += [".Sh ENVIRONMENT"] + tag_list(environment, "Ev ")
            body = tag_list(exit_status, "")
        elif title == "SEE ALSO":
            see_also = [line.split()[1] for line in body if line.startswith(".Xr ")]
            continue
        out += [f'.Sh "{title}"' if " " in title else f".Sh {title}"] + body
    if stem != "sandboxctl":
        see_also.insert(0, stem.rsplit(".", 1)[0])
    see_also = [page_name(name) for name in see_also if not name.endswith(".help")]
    if see_also:
        out += ['.Sh "SEE ALSO"'] + [f".Xr {name} 1 ," for name in see_also[:-1]] + [f".Xr {see_also[-1]} 1"]
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: man-pages.py GENERATED_DIR OUTPUT_DIR VERSION")
    generated, output = map(pathlib.Path, sys.argv[1:3])
    version = sys.argv[3]
    root = (generated / "sandboxctl.1").read_text().split("\n")
    _, sections = split_sections(root)
    description = next(body for title, body in sections if title == "DESCRIPTION")
    _, blocks = take_blocks(split_discussion(description)[0])
    if set(blocks) != set(BLOCKS):
        sys.exit("man-pages.py: the root command's discussion (Sources/sandboxctl/Sandboxctl.swift) lacks its "
                 "'Environment:' or 'Exit status:' block, which become every page's sections")
    output.mkdir(parents=True, exist_ok=True)
    for source in sorted(generated.glob("sandboxctl*.1")):
        if source.stem.endswith(".help"):
            continue
        page = convert(source.stem, source.read_text().rstrip("\n").split("\n"),
                       blocks["Environment:"], blocks["Exit status:"], version)
        (output / f"{page_name(source.stem)}.1").write_text(page)


if __name__ == "__main__":
    main()
