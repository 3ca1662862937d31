"""The status page's stylesheet, inlined into every page: the page needs no other request and
no build step, and a strict Content-Security-Policy can forbid everything but inline style."""

from __future__ import annotations

__all__ = ["STYLE"]

# Colour never carries meaning alone: every badge says its state in a word too.
STYLE = """
:root {
  color-scheme: light dark;
  --bg: #f3f5f8; --panel: #ffffff; --text: #18202b; --muted: #5d6878; --line: #dde2ea;
  --head: #f7f9fb; --accent: #2f5fd0;
  --ok: #1c7c43; --ok-bg: #e5f5eb; --bad: #b4232c; --bad-bg: #fdecec; --bad-row: #fff6f6;
  --warn: #9a5800; --warn-bg: #fff1d9; --warn-row: #fffaf0; --info: #1f5fbf; --info-bg: #e6effd;
  --mute-bg: #eceff3;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #0f141b; --panel: #171e27; --text: #e3e8ef; --muted: #95a1b2; --line: #2a3441;
    --head: #1c2430; --accent: #7ea6ff;
    --ok: #5fd08b; --ok-bg: #143323; --bad: #ff7b80; --bad-bg: #3d1a1d; --bad-row: #24181b;
    --warn: #f2b45a; --warn-bg: #3a2a12; --warn-row: #221d15; --info: #8cb4ff; --info-bg: #172a47;
    --mute-bg: #252e3a;
  }
}
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body {
  margin: 0; background: var(--bg); color: var(--text);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
    sans-serif;
}
.mono, code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas,
  "DejaVu Sans Mono", monospace; font-size: 12.5px; }
a { color: var(--accent); }
main { max-width: 1440px; margin: 0 auto; padding: 20px 24px 32px; }
header.top {
  display: flex; flex-wrap: wrap; gap: 8px 24px; align-items: flex-end;
  justify-content: space-between; margin-bottom: 16px;
}
h1 { margin: 0; font-size: 22px; letter-spacing: -0.01em; }
h2 { margin: 0 0 10px; font-size: 15px; text-transform: uppercase; letter-spacing: 0.04em;
  color: var(--muted); }
.sub { color: var(--muted); margin-top: 2px; }
.sub b { color: var(--text); font-weight: 600; }
.meta { color: var(--muted); text-align: right; }
.tiles { display: grid; grid-template-columns: repeat(auto-fit, minmax(130px, 1fr));
  gap: 10px; margin-bottom: 16px; }
.tile { background: var(--panel); border: 1px solid var(--line); border-radius: 10px;
  padding: 10px 14px; border-top: 4px solid var(--line); }
.tile .n { font-size: 26px; font-weight: 700; line-height: 1.1; }
.tile .l { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: 0.04em; }
.tile.bad { border-top-color: var(--bad); } .tile.bad .n { color: var(--bad); }
.tile.warn { border-top-color: var(--warn); } .tile.warn .n { color: var(--warn); }
.tile.ok { border-top-color: var(--ok); }
.tile.info { border-top-color: var(--info); }
section { margin-bottom: 20px; }
.nobody { padding: 12px 16px; color: var(--muted); }
details.departed { margin-top: 8px; }
details.departed summary { cursor: pointer; color: var(--muted); font-size: 13px; }
.panel { background: var(--panel); border: 1px solid var(--line); border-radius: 10px; }
.tablewrap { overflow-x: auto; }
.problems { padding: 12px 16px; border-left: 6px solid var(--bad); }
.problems h2 { color: var(--bad); }
.problems ul { margin: 0; padding-left: 20px; }
.problems li { margin: 4px 0; overflow-wrap: anywhere; }
.allgood { padding: 12px 16px; border-left: 6px solid var(--ok); color: var(--ok);
  font-weight: 600; }
.failure { padding: 16px 18px; border-left: 6px solid var(--bad); }
.failure h2 { color: var(--bad); }
.failure pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 8px 0 0; }
table { width: 100%; border-collapse: separate; border-spacing: 0; }
th { text-align: left; font-size: 12px; font-weight: 600; color: var(--muted);
  text-transform: uppercase; letter-spacing: 0.04em; background: var(--head);
  padding: 9px 12px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th:first-child { border-top-left-radius: 10px; }
th:last-child { border-top-right-radius: 10px; }
td { padding: 10px 12px; border-bottom: 1px solid var(--line); vertical-align: top;
  overflow-wrap: anywhere; }
tbody tr:last-child td { border-bottom: 0; }
tr.bad td { background: var(--bad-row); }
tr.warn td { background: var(--warn-row); }
tr.bad td:first-child { box-shadow: inset 5px 0 0 var(--bad); }
tr.warn td:first-child { box-shadow: inset 5px 0 0 var(--warn); }
.job { font-weight: 650; font-size: 14.5px; }
.trigger { color: var(--muted); margin-top: 2px; }
.small { color: var(--muted); font-size: 12px; }
.none { color: var(--muted); }
.badges { display: flex; flex-wrap: wrap; gap: 4px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 11.5px;
  font-weight: 700; letter-spacing: 0.04em; white-space: nowrap; border: 1px solid;
  text-transform: uppercase; }
.badge.ok { color: var(--ok); background: var(--ok-bg); }
.badge.bad { color: var(--bad); background: var(--bad-bg); }
.badge.warn { color: var(--warn); background: var(--warn-bg); }
.badge.info { color: var(--info); background: var(--info-bg); }
.badge.mute { color: var(--muted); background: var(--mute-bg); }
.detail { margin-top: 5px; font-size: 12.5px; }
.detail.bad { color: var(--bad); } .detail.warn { color: var(--warn); }
.outcome { font-weight: 600; }
.outcome.bad { color: var(--bad); } .outcome.ok { color: var(--ok); }
.outcome.warn { color: var(--warn); }
.error { color: var(--bad); white-space: pre-wrap; max-height: 9.5em; overflow: auto; }
.num { font-variant-numeric: tabular-nums; }
.num.warn { color: var(--warn); font-weight: 700; }
footer { color: var(--muted); font-size: 12px; margin-top: 8px; }
td time, td .none { white-space: nowrap; }
@media (max-width: 820px) {
  main { padding: 14px 12px 24px; }
  .meta { text-align: left; }
  .tablewrap { background: transparent; border: 0; }
  table.cards, table.cards tbody, table.cards tr, table.cards td { display: block; }
  table.cards thead, table.cards colgroup { display: none; }
  table.cards tr { background: var(--panel); border: 1px solid var(--line); border-radius: 10px;
    padding: 6px 0; margin-bottom: 10px; overflow: hidden; }
  table.cards td { display: grid; grid-template-columns: 7.5em minmax(0, 1fr); gap: 10px;
    border: 0; padding: 5px 14px; background: transparent; }
  table.cards tr.bad { background: var(--bad-row); box-shadow: inset 5px 0 0 var(--bad); }
  table.cards tr.warn { background: var(--warn-row); box-shadow: inset 5px 0 0 var(--warn); }
  table.cards tr.bad td, table.cards tr.warn td { background: transparent; box-shadow: none; }
  table.cards td::before { content: attr(data-label); color: var(--muted); font-size: 11.5px;
    text-transform: uppercase; letter-spacing: 0.04em; padding-top: 2px; }
  table.cards td.lead { display: block; padding-top: 8px; }
  table.cards td.lead::before { content: none; }
}
"""
