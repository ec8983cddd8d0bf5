// The console's one stylesheet, served as a file (the CSP allows no inline style or script).
export const CONSOLE_CSS = `
:root { color-scheme: light; --ink: #1d2430; --muted: #5b6575; --line: #d9dee6; --accent: #1f5fbf; --bad: #b3261e; --warn: #8a5a00; --good: #1e7a3c; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); background: #f6f7f9; }
header { display: flex; gap: 1.5rem; align-items: center; padding: .6rem 1.2rem; background: #1d2430; color: #fff; }
header a { color: #dfe7f5; text-decoration: none; margin-right: 1rem; }
header a:hover { text-decoration: underline; }
header nav { flex: 1; }
header .logout { display: flex; gap: .6rem; align-items: center; color: #c6cfdc; }
main { padding: 1rem 1.2rem 3rem; max-width: 1200px; }
h1 { font-size: 1.4rem; margin: .2rem 0 1rem; }
h2 { font-size: 1.05rem; margin: 1.4rem 0 .5rem; }
section.attention { border-left: 4px solid var(--bad); background: #fff4f3; padding: .4rem 1rem; }
section.calm { border-left: 4px solid var(--good); background: #f1faf3; padding: .4rem 1rem; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(180px, 1fr)); gap: .8rem; margin-top: 1rem; }
.cards div { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: .7rem .9rem; color: var(--muted); }
.figure { display: block; font-size: 1.6rem; color: var(--ink); font-weight: 600; }
table { border-collapse: collapse; background: #fff; width: 100%; }
th, td { border-bottom: 1px solid var(--line); padding: .3rem .5rem; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
th { background: #eef1f5; font-weight: 600; }
td.number, th.number { text-align: right; font-variant-numeric: tabular-nums; }
.outcome { padding: 0 .35rem; border-radius: 3px; background: #eef1f5; }
.outcome.applied { background: #e3f4e8; color: var(--good); }
.outcome.unmatched, .outcome.attention, .outcome.stale { background: #fff1d6; color: var(--warn); }
.outcome.trade_mismatch, .outcome.invalid, .outcome.unknown_status, .outcome.failed { background: #fde4e2; color: var(--bad); }
.outcome.done { background: #e3f4e8; color: var(--good); }
.outcome.pending, .outcome.running { background: #e6eefb; color: var(--accent); }
form.filter { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: end; background: #fff; border: 1px solid var(--line); padding: .7rem; border-radius: 6px; }
form.filter label { display: flex; flex-direction: column; font-size: .85rem; color: var(--muted); }
form.login { display: flex; flex-direction: column; gap: .7rem; max-width: 360px; }
form.login label { display: flex; flex-direction: column; }
form.inline { display: inline; }
input, select, button { font: inherit; padding: .25rem .45rem; }
button { cursor: pointer; border: 1px solid var(--accent); background: var(--accent); color: #fff; border-radius: 4px; }
button.danger { background: #8c2a1d; border-color: #8c2a1d; }
header button { background: transparent; border-color: #6b7789; }
dl.fields { display: grid; grid-template-columns: 12rem 1fr; gap: .3rem 1rem; background: #fff; border: 1px solid var(--line); padding: .8rem; border-radius: 6px; }
dl.fields dt { color: var(--muted); }
dl.fields dd { margin: 0; overflow-wrap: anywhere; }
pre.body { background: #fff; border: 1px solid var(--line); padding: .8rem; overflow: auto; max-height: 60vh; white-space: pre-wrap; overflow-wrap: anywhere; }
.problem { color: var(--bad); font-weight: 600; }
.result { font-size: 1.1rem; font-weight: 600; }
.hint { color: var(--muted); }
.unprintable { font-family: ui-monospace, monospace; font-size: .85em; background: #fff1d6; color: var(--warn); border-radius: 2px; }
.confirm { background: #fff; border: 1px solid var(--line); padding: .8rem 1rem; border-radius: 6px; margin-bottom: .8rem; }
`
