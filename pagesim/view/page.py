"""The HTML page: one self-contained file (inline CSS and SVG, no script, nothing fetched; its
Content-Security-Policy forbids every load) with the runs' summary, plots and configuration."""

from __future__ import annotations

import json
from html import escape

from pagesim.view.cluster import cluster_panels, is_cluster
from pagesim.view.panels import Panel, latency_panels, time_panels
from pagesim.view.runs import Run

# nothing may be loaded: no script, no image, no font, no frame, no connection; inline styles only
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 0 auto; max-width: 980px; padding: 0 16px 40px; }
h1 { font-size: 22px; margin: 24px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 4px; }
table { border-collapse: collapse; margin: 6px 0; } th, td { padding: 2px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; font-weight: 600; } td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
p.note { color: #555; margin: 2px 0 10px; } code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; } figure { margin: 0; } svg { max-width: 100%; height: auto; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
"""


def _fmt(value, digits: int = 3, unit: str = "", scale: float = 1.0) -> str:
    if value is None or isinstance(value, (dict, list)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) and scale == 1.0:
        return f"{value:,}{unit}"
    return f"{value * scale:,.{digits}f}{unit}"


# (row label, summary key, digits, unit, scale)
SUMMARY_ROWS = (
    ("requests", "num_requests", 0, "", 1), ("finished", "num_finished", 0, "", 1),
    ("rejected", "num_rejected", 0, "", 1), ("span (first arrival to last finish)", "duration_s", 1, " s", 1),
    ("request throughput", "request_throughput", 3, " req/s", 1),
    ("output token throughput", "output_token_throughput", 1, " tok/s", 1),
    ("TTFT mean", "ttft_mean", 3, " s", 1), ("TTFT p50", "ttft_p50", 3, " s", 1), ("TTFT p99", "ttft_p99", 3, " s", 1),
    ("TPOT mean", "tpot_mean", 2, " ms", 1e3), ("TPOT p99", "tpot_p99", 2, " ms", 1e3),
    ("ITL mean", "mean_itl_ms", 2, " ms", 1), ("ITL p99", "p99_itl_ms", 2, " ms", 1),
    ("end-to-end mean", "e2e_mean", 2, " s", 1), ("end-to-end p99", "e2e_p99", 2, " s", 1),
    ("mean normalized latency", "mean_normalized_latency", 4, " s/token", 1),
    ("mean batched requests", "mean_batched_requests", 2, "", 1),
    ("KV utilization mean", "mean_kv_utilization", 1, " %", 100), ("KV utilization peak", "peak_kv_utilization", 1, " %", 100),
    ("preemptions", "num_preemptions", 0, "", 1), ("swapped blocks", "num_swapped_blocks", 0, "", 1),
    ("steps", "num_steps", 0, "", 1),
)


def summary_cell(summary: dict, key: str, digits: int, unit: str, scale: float) -> str:
    value = summary.get(key)
    if key == "duration_s" and value is not None:
        unit += " simulated" if "cost_model" in summary else " measured"
    return _fmt(value, digits, unit, scale)


def render(runs: list[Run]) -> str:
    """The page for these runs (overlaid where more than one)."""
    from pagesim.view.charts import color

    title = "pagesim: " + ", ".join(r.label for r in runs)
    parts = [f"<h1>{escape(title)}</h1>", "<p class='note'>One page per run (or runs overlaid, one colour each), "
             "made by <code>pagesim view</code> from the run's result files. Times on a replay's axes are simulated "
             "time; a real run's are measured.</p>", "<h2>Runs</h2>", "<table><tr><th>run</th><th>folder</th>"
             "<th>clock</th><th>what ran</th></tr>"]
    for i, r in enumerate(runs):
        parts.append(f"<tr><td><span class='swatch' style='background:{color(i)}'></span>{escape(r.label)}</td>"
                     f"<td><code>{escape(str(r.path))}</code></td><td>{r.clock}</td><td>{escape(_what_ran(r))}</td></tr>")
    parts.append("</table>")
    parts += _summary_table(runs)
    parts += _validate_tables(runs)
    parts.append("<h2>Over time</h2>")
    parts += map(_panel_html, time_panels(runs))
    parts.append("<h2>Latency distributions</h2>")
    parts += map(_panel_html, latency_panels(runs))
    for r in runs:
        if is_cluster(r):
            parts.append(f"<h2>Per replica: {escape(r.label)}</h2>")
            parts += map(_panel_html, cluster_panels(r))
    parts.append("<h2>Configuration and summary</h2>")
    for r in runs:
        parts += _config_html(r)
    body = "\n".join(parts)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">\n"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>\n<title>{escape(title)}</title>\n"
            f"<style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")


def _what_ran(run: Run) -> str:
    s, cfg = run.summary, run.summary.get("config") or {}
    words = []
    for key in ("policy", "model", "gpu"):
        if cfg.get(key):
            words.append(str(cfg[key]))
    if s.get("model") and not cfg.get("model"):  # bench: the server's model id
        words.append(str(s["model"]))
    if s.get("trace"):
        words.append(f"trace {s['trace']}")
    return " · ".join(words) or "-"


def _summary_table(runs: list[Run]) -> list[str]:
    head = "".join(f"<th>{escape(r.label)}</th>" for r in runs)
    rows = [f"<h2>Summary</h2><table id='summary'><tr><th>from summary.json</th>{head}</tr>"]
    for label, key, digits, unit, scale in SUMMARY_ROWS:
        if all(r.summary.get(key) is None for r in runs):
            continue
        cells = "".join(f"<td class='num'>{escape(summary_cell(r.summary, key, digits, unit, scale))}</td>" for r in runs)
        rows.append(f"<tr><th>{escape(label)}</th>{cells}</tr>")
    rows.append("</table>")
    for r in runs:
        for note in r.summary.get("notes") or []:
            rows.append(f"<p class='note'>{escape(r.label)}: {escape(str(note))}</p>")
        for reason, count in (r.summary.get("reject_reasons") or {}).items():
            rows.append(f"<p class='note'>{escape(r.label)}: rejected {count:,}: {escape(str(reason))}</p>")
    return rows


def _validate_tables(runs: list[Run]) -> list[str]:
    out = []
    for r in runs:
        v = r.validate
        if not isinstance(v, dict) or not isinstance(v.get("overall"), dict):
            continue
        out.append(f"<h2>Measured against predicted: {escape(r.label)}</h2>")
        out.append(f"<p class='note'>validate.json: the recorded run {escape(str(v.get('run', '')))} beside this "
                   "replay of it. It holds the measured run's statistics, not its requests, so the plots show the "
                   "replay; give the measured run's own folder too (a pagesim bench folder) to overlay them.</p>")
        out.append("<table><tr><th>metric</th><th>measured</th><th>predicted</th><th>error</th></tr>")
        for key, cell in v["overall"].items():
            if not isinstance(cell, dict):
                continue
            seconds = key.endswith(("_mean", "_median", "_p90", "_p99"))
            digits, unit, scale = (1, " ms", 1e3) if seconds else (1, "", 1)
            error = cell.get("error")
            out.append(f"<tr><th>{escape(key)}</th><td class='num'>{_fmt(cell.get('measured'), digits, unit, scale)}</td>"
                       f"<td class='num'>{_fmt(cell.get('predicted'), digits, unit, scale)}</td>"
                       f"<td class='num'>{'-' if error is None else f'{error * 100:+.1f} %'}</td></tr>")
        out.append("</table>")
    return out


def _panel_html(panel: Panel) -> str:
    note = f"<p class='note'>{escape(panel.note)}</p>" if panel.note else ""
    if panel.svg is None:
        return f"<section class='panel missing'><h3>{escape(panel.title)}</h3>{note}</section>"
    return f"<section class='panel'><h3>{escape(panel.title)}</h3><figure>{panel.svg}</figure>{note}</section>"


def _config_html(run: Run) -> list[str]:
    s = run.summary
    out = [f"<h3>{escape(run.label)}</h3>"]
    if s.get("reproduce"):
        out.append(f"<p class='note'>reproduce with: <code>{escape(str(s['reproduce']))}</code></p>")
    cfg = s.get("config")
    if isinstance(cfg, dict):
        rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(json.dumps(v))}</td></tr>" for k, v in sorted(cfg.items()))
        out.append(f"<details open><summary>configuration (summary.json's config)</summary><table>{rows}</table></details>")
    else:
        out.append("<p class='note'>summary.json holds no config (a measured run records the server's options "
                   "where the server reports them).</p>")
    out.append(f"<details><summary>summary.json</summary><pre>{escape(json.dumps(s, indent=2, sort_keys=True))}</pre>"
               "</details>")
    return out
