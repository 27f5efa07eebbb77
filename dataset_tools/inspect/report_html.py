"""The dataset report as one self-contained HTML page, and the contact sheet as one PNG.

The page needs no network and runs no script: styles are inline, charts are CSS bars, and every
image is a ``data:`` URI. Elements the browser test (and other scripts) look for carry stable
attributes: ``data-count="written"`` on each header count, ``data-split-examples="train"`` on
each split's total, ``img.sample`` in the contact sheets, and ``.pair.leakage`` on every
train-validation near-duplicate pair.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from PIL import Image, ImageDraw

from cliflags import plural
from dataset_tools.inspect.inspection import THUMBNAIL, PairView, Report, Sample, Thumbnail

__all__ = ["render_html", "contact_sheet_png", "write_report"]

_STYLE = (
    """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d232a;
background:#f6f7f9}
header,section{background:#fff;margin:14px auto;max-width:1180px;padding:14px 20px;
border-radius:8px;box-shadow:0 1px 3px #0002}
h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:0 0 10px}h3{font-size:15px;margin:14px 0 6px}
.muted{color:#667}.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
dl.counts{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
dl.counts div{background:#eef2f7;border-radius:6px;padding:6px 12px;min-width:90px}
dl.counts dt{font-size:12px;color:#556}dl.counts dd{margin:0;font-size:20px;font-weight:600}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px;text-align:left;
border-bottom:1px solid #e3e6ea;vertical-align:top}th{font-weight:600}td.num,th.num{text-align:right}
.bar{display:inline-block;height:12px;border-radius:2px;vertical-align:middle;margin-right:6px}
.train{background:#3b7dd8}.validation{background:#e69a2e}.other{background:#7a59c9}
.alert{background:#fdecea;border-left:4px solid #d93025;padding:8px 12px;margin:8px 0}
.ok{background:#e8f5e9;border-left:4px solid #2e7d32;padding:8px 12px;margin:8px 0}
.sheet{display:flex;flex-wrap:wrap;gap:8px}
figure{margin:0;width:"""
    + str(THUMBNAIL)
    + """px;font-size:11px}
figure img{display:block;max-width:100%;border-radius:3px;background:#ddd}
figcaption{color:#445;overflow-wrap:anywhere}
.pair{display:flex;gap:14px;align-items:flex-start;padding:8px;margin:6px 0;border-radius:6px;
background:#f3f4f6}.pair.leakage{background:#fdecea}.pair.cross{background:#fff4e0}
.tag{display:inline-block;font-size:11px;border-radius:3px;padding:0 5px;margin-right:4px;
color:#fff;background:#667}.tag.leak{background:#d93025}.tag.cross{background:#e69a2e}
nav a{margin-right:12px}
"""
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TiB"


def _data_uri(thumb: Thumbnail) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(thumb.data).decode("ascii")


def _img(thumb: Thumbnail, css: str, alt: str) -> str:
    return (
        f'<img class="{css}" src="{_data_uri(thumb)}" width="{thumb.width}" '
        f'height="{thumb.height}" alt="{_e(alt)}" loading="eager">'
    )


def _figure(sample: Sample, css: str = "sample") -> str:
    note = f'<br><b class="muted">{_e(sample.thumbnail.note)}</b>' if sample.thumbnail.note else ""
    name = sample.uri.rsplit("/", 1)[-1]
    return (
        f'<figure data-key="{_e(sample.key)}">{_img(sample.thumbnail, css, sample.uri)}'
        f'<figcaption><span class="bar {_e(sample.split)}" style="width:8px"></span>'
        f"{_e(sample.split)} #{sample.index} · {_e(sample.text)}<br>"
        f'<span class="mono" title="{_e(sample.uri)}">{_e(name)}</span><br>'
        f'<span class="muted">{_e(sample.stored)}</span>{note}</figcaption></figure>'
    )


def _header(stats: dict[str, Any]) -> str:
    counts = stats["counts"]
    cells = "".join(
        f'<div><dt>{_e(name)}</dt><dd data-count="{_e(name)}">{value:,}</dd></div>'
        for name, value in counts.items()
    )
    splits = "".join(
        f'<div><dt>{_e(name)} examples</dt><dd data-split-examples="{_e(name)}">'
        f"{info['examples']:,}</dd></div>"
        for name, info in stats["splits"].items()
    )
    image = stats["image"]
    options = stats["options"]
    shown_options = {
        k: options[k]
        for k in (
            "image_size",
            "crop",
            "encoding",
            "jpeg_quality",
            "validation_fraction",
            "stratify_validation",
            "label_conflicts",
            "leakage",
            "near_duplicate_threshold",
            "small_images",
            "min_source_side",
            "image_library",
        )
        if k in options
    }
    lineage = stats.get("lineage")
    lineage_html = (
        f'<p>Lineage: <span class="mono">{_e(json.dumps(lineage, sort_keys=True))}</span></p>'
        if lineage
        else '<p class="muted">Lineage: a clean build (no base dataset).</p>'
    )
    near = stats["near_duplicates"]
    remedy = near.get("remedy")
    verdict = (
        f'<div class="alert" id="leakage-verdict"><b>'
        f"{plural(near['leakage'], 'train–validation leakage pair')}</b>: validation images "
        "with a near-duplicate in train inflate validation scores. "
        '<a href="#near-duplicates">See them</a>.'
        + (f'<p id="leakage-remedy">To fix: {_e(remedy)}.</p>' if remedy else "")
        + "</div>"
        if near["leakage"]
        else '<div class="ok" id="leakage-verdict">No train–validation near-duplicates within '
        f"{near['threshold']} bits.</div>"
    )
    return (
        f"<header><h1>Dataset report</h1>"
        f'<div class="mono muted">{_e(stats["dataset"])}</div>'
        f'<dl class="counts">{cells}</dl><dl class="counts">{splits}'
        f'<div><dt>shards</dt><dd data-count="shards">{stats["num_shards"]:,}</dd></div>'
        f"<div><dt>total size</dt><dd>{_size(stats['total_bytes'])}</dd></div></dl>"
        f"{verdict}"
        f"<p>Stored images: {_e(image.get('encoding'))}, shorter side "
        f"{_e(image.get('image_size'))}, crop {_e(image.get('crop'))}, "
        f"{_e(image.get('color_space', 'sRGB'))}. Options: "
        f'<span class="mono">{_e(json.dumps(shown_options, ensure_ascii=False))}</span></p>'
        f"{lineage_html}"
        '<nav><a href="#classes">Classes</a><a href="#samples">Samples</a>'
        '<a href="#distributions">Distributions</a><a href="#rejected">Rejected</a>'
        '<a href="#duplicates">Duplicates</a><a href="#near-duplicates">Near-duplicates</a>'
        f'</nav><p class="muted">Seed {stats["seed"]}, {stats["per_class"]} per class; '
        f"{plural(stats['records_read'], 'record')} read by byte range "
        f"({_size(stats['bytes_read'])}).</p></header>"
    )


def _classes(stats: dict[str, Any]) -> str:
    splits = [s for s, info in stats["splits"].items() if info["class_counts"] is not None]
    if not splits:
        return '<section id="classes"><h2>Classes</h2><p>No class counts.</p></section>'
    top = max((c for s in splits for c in stats["splits"][s]["class_counts"].values()), default=1)
    rows = []
    for name in stats["label_names"]:
        bars = "".join(
            f'<td class="num">{stats["splits"][s]["class_counts"][name]:,}</td>'
            f'<td><span class="bar {_e(s if s in ("train", "validation") else "other")}" '
            f'style="width:{300 * stats["splits"][s]["class_counts"][name] / max(top, 1):.0f}px">'
            "</span></td>"
            for s in splits
        )
        rows.append(f"<tr><th>{_e(name)}</th>{bars}</tr>")
    head = "".join(f'<th class="num">{_e(s)}</th><th></th>' for s in splits)
    alerts = []
    for s in splits:
        info = stats["splits"][s]["imbalance"]
        if not info.get("flagged"):
            continue
        if info["missing"]:
            alerts.append(f"<b>{_e(s)}</b> has no examples of {_e(', '.join(info['missing']))}.")
        if info.get("max_over_min"):
            alerts.append(
                f"<b>{_e(s)}</b> is imbalanced: {_e(info['largest'])} has "
                f"{info['max_over_min']:.1f}× the examples of {_e(info['smallest'])}."
            )
    callout = (
        '<div class="alert" id="imbalance">' + "<br>".join(alerts) + "</div>"
        if alerts
        else '<div class="ok" id="imbalance">Classes are balanced within each split '
        "(largest ≤ 1.5× smallest).</div>"
    )
    return (
        f'<section id="classes"><h2>Examples per class and split</h2>{callout}'
        f"<table><tr><th>class</th>{head}</tr>{''.join(rows)}</table></section>"
    )


def _samples(report: Report) -> str:
    parts = []
    for name, rows in report.samples.items():
        figures = "".join(_figure(s) for s in rows) or '<p class="muted">No examples.</p>'
        parts.append(
            f'<h3>{_e(name)} <span class="muted">({len(rows)} shown)</span></h3>'
            f'<div class="sheet" data-class="{_e(name)}">{figures}</div>'
        )
    return (
        '<section id="samples"><h2>Contact sheets</h2><p class="muted">Seeded samples per '
        "class, decoded from the shards as stored: what the trainer gets.</p>"
        + "".join(parts)
        + "</section>"
    )


def _bars(edges: Sequence[float], counts: Sequence[int], fmt) -> str:
    top = max(counts, default=0) or 1
    used = [i for i, count in enumerate(counts) if count]
    first, last = (used[0], used[-1]) if used else (0, 0)  # empty bins at either end: left out
    rows = []
    for i, count in list(enumerate(counts))[first : last + 1]:
        upper = fmt(edges[i + 1]) if i + 1 < len(edges) else "∞"
        rows.append(
            f'<tr><td>{fmt(edges[i])} – {upper}</td><td class="num">{count:,}</td>'
            f'<td><span class="bar other" style="width:{240 * count / top:.0f}px"></span></td></tr>'
        )
    return "<table>" + "".join(rows) + "</table>"


def _counts_table(counts: dict[str, int]) -> str:
    top = max(counts.values(), default=0) or 1
    rows = "".join(
        f'<tr><td>{_e(k)}</td><td class="num">{v:,}</td><td><span class="bar other" '
        f'style="width:{240 * v / top:.0f}px"></span></td></tr>'
        for k, v in counts.items()
    )
    return f"<table>{rows}</table>"


def _distributions(stats: dict[str, Any]) -> str:
    d = stats["distributions"]

    def summary(h: dict[str, Any], fmt) -> str:
        if "median" not in h:
            return ""
        return (
            f'<p class="muted">min {fmt(h["min"])}, median {fmt(h["median"])}, '
            f"mean {fmt(h['mean'])}, max {fmt(h['max'])}</p>"
        )

    def px(v: float) -> str:
        return f"{v:.0f}px"

    def mp(v: float) -> str:
        return f"{v:g} MP"

    shards = "".join(
        f'<tr><td class="mono">{_e(s["file"])}</td><td class="num">{s["num_examples"]:,}</td>'
        f'<td class="num">{_size(s["num_bytes"])}</td></tr>'
        for s in d["shards"][:64]
    )
    more = (
        f'<p class="muted">… {len(d["shards"]) - 64} more shards</p>'
        if len(d["shards"]) > 64
        else ""
    )
    return (
        '<section id="distributions"><h2>Distributions</h2>'
        "<h3>Source formats</h3>"
        + _counts_table(d["source_format"])
        + "<h3>Stored formats</h3>"
        + _counts_table(d["stored_format"])
        + "<h3>Source shorter side</h3>"
        + _bars(d["source_shorter_side"]["edges"], d["source_shorter_side"]["counts"], px)
        + summary(d["source_shorter_side"], px)
        + _small_sources(stats)
        + "<h3>Source megapixels</h3>"
        + _bars(d["source_megapixels"]["edges"], d["source_megapixels"]["counts"], mp)
        + "<h3>Source file size</h3>"
        + _bars(d["source_bytes"]["edges"], d["source_bytes"]["counts"], _size)
        + summary(d["source_bytes"], _size)
        + "<h3>Stored bytes per example (the record's frame)</h3>"
        + _bars(d["stored_bytes"]["edges"], d["stored_bytes"]["counts"], _size)
        + summary(d["stored_bytes"], _size)
        + "<h3>Shard sizes</h3>"
        + summary(d["shard_bytes"], _size)
        + f'<table><tr><th>shard</th><th class="num">examples</th><th class="num">size</th></tr>'
        f"{shards}</table>{more}</section>"
    )


def _small_sources(stats: dict[str, Any]) -> str:
    """What happened to sources smaller than the stored size: the histogram alone hides it."""
    counts, options = stats["counts"], stats["options"]
    policy = options.get("small_images")
    rule = (
        f" (--small_images {_e(policy)}, --min_source_side {_e(options.get('min_source_side'))})"
        if policy is not None
        else ""
    )
    return (
        f'<p id="small-sources"><b data-count="upscaled-note">{counts["upscaled"]:,}</b> '
        f"example{'s' if counts['upscaled'] != 1 else ''} stored larger than the source "
        f"(upscaled); {counts['too_small']:,} source{'s' if counts['too_small'] != 1 else ''} "
        f"rejected as too small{rule}.</p>"
    )


def _rejected(report: Report) -> str:
    stats = report.stats["rejected"]
    if not stats["count"]:
        return '<section id="rejected"><h2>Rejected files</h2><p class="ok">None.</p></section>'
    parts = []
    for reason, views in report.rejected.items():
        count = stats["by_reason"].get(reason, len(views))
        rows = []
        for v in views:
            thumb = (
                _img(v.thumbnail, "rejected-thumb", v.uri)
                + (
                    f'<br><span class="muted">{_e(v.thumbnail.note)}</span>'
                    if v.thumbnail.note
                    else ""
                )
                if v.thumbnail
                else '<span class="muted">not readable</span>'
            )
            rows.append(
                f'<tr><td>{thumb}</td><td class="mono">{_e(v.uri)}</td><td>{_e(v.detail)}</td></tr>'
            )
        more = (
            f'<p class="muted">… and {count - len(views):,} more</p>' if count > len(views) else ""
        )
        parts.append(
            f'<h3 data-reason="{_e(reason)}">{_e(reason)} <span class="muted">({count:,})</span></h3>'
            f"<table>{''.join(rows)}</table>{more}"
        )
    return (
        f'<section id="rejected"><h2>Rejected files ({stats["count"]:,})</h2>'
        + "".join(parts)
        + "</section>"
    )


def _duplicates(report: Report) -> str:
    stats = report.stats["duplicates"]
    conflict = '<span class="tag leak">label conflict</span>'
    rows = "".join(
        f"<tr><td>{conflict if d.get('label_conflict') else 'copy'}</td>"
        f'<td class="mono">{_e(d.get("uri"))}</td><td>{_e(d.get("label") or "")}</td>'
        f'<td class="mono">{_e(d.get("kept_uri") or "(none kept)")}</td>'
        f"<td>{_e(d.get('kept_label') or '')}</td></tr>"
        for d in report.duplicates
    )
    table = (
        "<table><tr><th></th><th>dropped</th><th>class</th><th>kept</th><th>class</th></tr>"
        f"{rows}</table>"
        if rows
        else '<p class="ok">None.</p>'
    )
    return (
        f'<section id="duplicates"><h2>Exact duplicates ({stats["count"]:,}) and label '
        f"conflicts ({stats['label_conflicts']:,})</h2>"
        '<p class="muted">Byte-identical files: one copy is stored. The same bytes under two '
        "classes is a label conflict.</p>"
        f"{table}</section>"
    )


def _pair(pair: PairView) -> str:
    css = "pair leakage" if pair.leakage else "pair cross" if pair.cross_class else "pair"
    tags = (
        ('<span class="tag leak">train–validation leakage</span>' if pair.leakage else "")
        + ('<span class="tag cross">cross-class</span>' if pair.cross_class else "")
        + ('<span class="tag">mirrored</span>' if pair.flipped else "")
    )
    sides = []
    for sample, uri in ((pair.a, pair.a_uri), (pair.b, pair.b_uri)):
        sides.append(_figure(sample, "pair-image") if sample else f'<p class="mono">{_e(uri)}</p>')
    return (
        f'<div class="{css}" data-a-uri="{_e(pair.a_uri)}" data-b-uri="{_e(pair.b_uri)}" '
        f'data-distance="{pair.distance}">{"".join(sides)}'
        f"<div>{tags}<p>distance <b>{pair.distance}</b> bit{'' if pair.distance == 1 else 's'}"
        "</p></div></div>"
    )


def _near_duplicates(report: Report) -> str:
    near = report.stats["near_duplicates"]
    head = (
        f'<section id="near-duplicates"><h2>Near-duplicates '
        f"({plural(near['pairs'], 'pair', grouped=True)}; "
        f"{near['leakage']:,} train–validation, {near['cross_class']:,} cross-class)</h2>"
        f'<p class="muted">Perceptual hashes within {near["threshold"]} of 64 bits (mirror images '
        f"included); source: {_e(near['source'])}. Leakage first.</p>"
    )
    if not report.pairs:
        return head + '<p class="ok">None.</p></section>'
    more = (
        f'<p class="muted">… {near["pairs"] - near["shown"]:,} more in near_duplicates.jsonl</p>'
        if near["pairs"] > near["shown"]
        else ""
    )
    return head + "".join(_pair(p) for p in report.pairs) + more + "</section>"


def render_html(report: Report) -> str:
    """The whole page."""
    body = (
        _header(report.stats)
        + _classes(report.stats)
        + _samples(report)
        + _distributions(report.stats)
        + _rejected(report)
        + _duplicates(report)
        + _near_duplicates(report)
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        # An empty icon: without it a browser asks the (absent) server for /favicon.ico.
        '<link rel="icon" href="data:,"><title>Dataset report</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


def contact_sheet_png(report: Report, columns: int | None = None) -> bytes:
    """One PNG: a row per class (its name, then its samples' thumbnails)."""
    from PIL import ImageFont

    font = ImageFont.load_default()
    cell = THUMBNAIL + 8
    label_width = 150
    rows: Iterable[tuple[str, list[Sample]]] = list(report.samples.items())
    per_row = columns or max((len(s) for _, s in rows), default=1) or 1
    height = max(1, sum(max(1, -(-len(s) // per_row)) for _, s in rows)) * cell + 8
    sheet = Image.new("RGB", (label_width + per_row * cell + 8, height), (246, 247, 249))
    draw = ImageDraw.Draw(sheet)
    y = 8
    for name, samples in rows:
        draw.text((8, y + 4), name, fill=(20, 20, 20), font=font)
        for i, sample in enumerate(samples):
            row, col = divmod(i, per_row)
            with Image.open(io.BytesIO(sample.thumbnail.data)) as thumb:
                sheet.paste(thumb.convert("RGB"), (label_width + col * cell, y + row * cell))
        y += max(1, -(-len(samples) // per_row)) * cell
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def write_report(report: Report, out_dir: str) -> dict[str, str]:
    """Writes ``index.html``, ``contact_sheet.png`` and ``stats.json``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "html": os.path.join(out_dir, "index.html"),
        "contact_sheet": os.path.join(out_dir, "contact_sheet.png"),
        "stats": os.path.join(out_dir, "stats.json"),
    }
    contents = {
        "html": render_html(report).encode("utf-8"),
        "contact_sheet": contact_sheet_png(report),
        "stats": (
            json.dumps(report.stats, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        ).encode("utf-8"),
    }
    for name, path in paths.items():
        temporary = f"{path}.tmp-{os.getpid()}"
        with open(temporary, "wb") as handle:
            handle.write(contents[name])
        os.replace(temporary, path)
    return paths
