import {
  useCallback,
  useEffect,
  useRef,
  useState,
  type ButtonHTMLAttributes,
  type InputHTMLAttributes,
  type ReactNode,
  type RefObject,
  type SelectHTMLAttributes,
  type TableHTMLAttributes,
} from "react";
import { ApiError, api, type Span } from "./api";

// --- data loading -------------------------------------------------------------------------------

export function useApi<T>(path: string | null, deps: unknown[] = [], pollMs = 0) {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [loading, setLoading] = useState(true);
  const load = useCallback(async () => {
    if (path === null) return;
    try {
      const d = await api<T>(path);
      setData(d);
      setError(null);
    } catch (e) {
      setError(e instanceof ApiError ? e : new ApiError(0, String(e)));
    } finally {
      setLoading(false);
    }
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [path, ...deps]);
  useEffect(() => {
    setLoading(true);
    load();
    if (!pollMs) return;
    const t = window.setInterval(load, pollMs);
    return () => window.clearInterval(t);
  }, [load, pollMs]);
  return { data, error, loading, reload: load };
}

/** Runs a change (a POST, PUT, ...), keeps its error for the page and reloads what it changed. */
export function useAction(after: () => void) {
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const run = async (fn: () => Promise<unknown>) => {
    setBusy(true);
    setError(null);
    try {
      await fn();
      after();
      return true;
    } catch (e) {
      setError(e as ApiError);
      return false;
    } finally {
      setBusy(false);
    }
  };
  /** A destructive change: runs only once the person confirms ``question``. */
  const confirmed = (question: string, fn: () => Promise<unknown>) => (window.confirm(question) ? run(fn) : Promise.resolve(false));
  return { error, busy, run, confirmed };
}

// --- tables and lists ---------------------------------------------------------------------------

/** A table's header row: the column names, and a last column for row actions named for screen readers. */
export function TableHead({ cols, actions }: { cols: string[]; actions?: string }) {
  return (
    <thead>
      <tr>
        {cols.map((c) => (
          <th scope="col" key={c}>
            {c}
          </th>
        ))}
        {actions && (
          <th scope="col">
            <span className="sr-only">{actions}</span>
          </th>
        )}
      </tr>
    </thead>
  );
}

type TableProps = { caption?: string; showCaption?: boolean; cols: string[]; actions?: string } & Omit<TableHTMLAttributes<HTMLTableElement>, "children">;

/** A table (class "table") of ``children`` rows under a header row; its caption is for screen readers only unless ``showCaption``. */
export function Table({ caption, showCaption, cols, actions, children, ...table }: TableProps & { children: ReactNode }) {
  return (
    <table className="table" {...table}>
      {caption && <caption className={showCaption ? undefined : "sr-only"}>{caption}</caption>}
      <TableHead cols={cols} actions={actions} />
      <tbody>{children}</tbody>
    </table>
  );
}

/** A button that acts on one row: its word, then the row it acts on for screen readers ("Delete" "gold"). */
export function RowButton({ label, target, ...button }: { label: ReactNode; target: ReactNode } & ButtonHTMLAttributes<HTMLButtonElement>) {
  return (
    <button type="button" {...button}>
      {label} <span className="sr-only">{target}</span>
    </button>
  );
}

/** Newer/older pages of a list of ``count`` entries, ``limit`` a page. */
export function Pager({ label, offset, limit, count, onChange }: { label: string; offset: number; limit: number; count: number; onChange: (offset: number) => void }) {
  return (
    <nav className="pager" aria-label={label}>
      <button type="button" className="secondary" disabled={offset === 0} onClick={() => onChange(Math.max(0, offset - limit))}>
        Newer
      </button>
      <span>
        {offset + 1}–{Math.min(offset + limit, count)} of {count}
      </span>
      <button type="button" className="secondary" disabled={offset + limit >= count} onClick={() => onChange(offset + limit)}>
        Older
      </button>
    </nav>
  );
}

type LoadedProps<T> = {
  q: { data: T | null; error: ApiError | null; loading: boolean };
  what: string;
  empty?: ReactNode;
  isEmpty?: (data: T) => boolean;
  showError?: boolean;
};

/** What ``useApi`` loads, in its states: the error, "Loading …" until the first answer, then ``empty`` where there
 * is nothing (an empty list, or what ``isEmpty`` says) and ``children(data)`` where there is. Without ``empty``, an
 * empty answer goes to ``children`` too; ``showError={false}`` where the page shows the error elsewhere. */
export function Loaded<T>({ q, what, empty, isEmpty = (d) => Array.isArray(d) && d.length === 0, showError = true, children }: LoadedProps<T> & {
  children: (data: T) => ReactNode;
}) {
  const none = q.data !== null && empty !== undefined && isEmpty(q.data);
  return (
    <>
      {showError && <ErrorMessage error={q.error} />}
      {q.loading && !q.data && <Loading what={what} />}
      {none && <Empty>{empty}</Empty>}
      {q.data !== null && !none && children(q.data)}
    </>
  );
}

/** A list that ``useApi`` loads, in its states (see ``Loaded``), as a table in a card: ``children`` makes a row of an entry. */
export function LoadedTable<T>({ q, what, empty, showError, children, ...table }: LoadedProps<T[]> & TableProps & { children: (entry: T) => ReactNode }) {
  return (
    <Loaded q={q} what={what} empty={empty} showError={showError}>
      {(list) => (
        <div className="card table-scroll">
          <Table {...table}>{list.map((entry) => children(entry))}</Table>
        </div>
      )}
    </Loaded>
  );
}

// --- forms --------------------------------------------------------------------------------------

type KeysOf<F, V> = { [K in keyof F]: F[K] extends V ? K : never }[keyof F];

/** A form's fields in one state, and the props that bind one field to its control (``value``/``checked`` and ``onChange``). */
export function useForm<F extends object>(initial: F) {
  const [form, setForm] = useState(initial);
  const set = (k: keyof F, v: unknown) => setForm((f) => ({ ...f, [k]: v }));
  return {
    form,
    setForm,
    /** a text box, select or text area whose field is a string */
    text: (k: KeysOf<F, string>) => ({ value: form[k] as string, onChange: (e: { target: { value: string } }) => set(k, e.target.value) }),
    /** a number box whose field is a number */
    num: (k: KeysOf<F, number>) => ({ value: form[k] as number, onChange: (e: { target: { value: string } }) => set(k, Number(e.target.value)) }),
    /** a check box */
    check: (k: KeysOf<F, boolean>) => ({ checked: form[k] as boolean, onChange: (e: { target: { checked: boolean } }) => set(k, e.target.checked) }),
  };
}

/** A control under its label, in a div of their own (a cell of a form's grid or row) unless ``bare``. */
export function Field({ id, label, bare, children }: { id: string; label: ReactNode; bare?: boolean; children: ReactNode }) {
  const both = (
    <>
      <label htmlFor={id}>{label}</label>
      {children}
    </>
  );
  return bare ? both : <div>{both}</div>;
}

type Labelled = { id: string; label: ReactNode; bare?: boolean };

export function InputField({ id, label, bare, ...input }: Labelled & InputHTMLAttributes<HTMLInputElement>) {
  return (
    <Field id={id} label={label} bare={bare}>
      <input id={id} {...input} />
    </Field>
  );
}

/** One option of a select: a record's id and name, or a value and its words. */
export interface Choice {
  id: string;
  name: string;
}

/** A select of ``options``, after a first option of value "" that says ``placeholder`` where there is one. */
export function SelectField({ id, label, bare, options, placeholder, ...select }: Labelled & {
  options?: readonly Choice[] | null; placeholder?: string;
} & SelectHTMLAttributes<HTMLSelectElement>) {
  return (
    <Field id={id} label={label} bare={bare}>
      <select id={id} {...select}>
        {placeholder !== undefined && <option value="">{placeholder}</option>}
        {options?.map((o) => (
          <option key={o.id} value={o.id}>
            {o.name}
          </option>
        ))}
      </select>
    </Field>
  );
}

/** A choice among ``options`` that falls on the first once they have loaded (until one is made). */
export function useFirstChoice(options: readonly Choice[] | null | undefined) {
  const [id, setId] = useState("");
  useEffect(() => {
    if (!id && options?.length) setId(options[0].id);
  }, [options, id]);
  return [id, setId] as const;
}

// --- page frame ---------------------------------------------------------------------------------

export function Page({ title, intro, children, actions }: { title: string; intro?: ReactNode; children: ReactNode; actions?: ReactNode }) {
  const h1 = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    document.title = `${title} · Baton console`;
    h1.current?.focus();
  }, [title]);
  return (
    <section className="page" aria-labelledby="page-title">
      <div className="page-head">
        <div>
          <h1 id="page-title" tabIndex={-1} ref={h1}>
            {title}
          </h1>
          {intro && <p className="intro">{intro}</p>}
        </div>
        {actions && <div className="page-actions">{actions}</div>}
      </div>
      {children}
    </section>
  );
}

export function ErrorMessage({ error, title }: { error: ApiError | Error | string | null; title?: string }) {
  if (!error) return null;
  const message = typeof error === "string" ? error : error.message;
  const status = error instanceof ApiError && error.status ? ` (HTTP ${error.status})` : "";
  return (
    <div className="error" role="alert">
      <strong>{title ?? (error instanceof ApiError && error.status === 403 ? "Permission denied" : "Something went wrong")}</strong>
      <span>
        {message}
        {status}
      </span>
    </div>
  );
}

export function Loading({ what }: { what: string }) {
  return (
    <p className="muted" role="status" aria-live="polite">
      Loading {what}…
    </p>
  );
}

export function Empty({ children }: { children: ReactNode }) {
  return <p className="empty">{children}</p>;
}

export function Stat({ label, value, hint }: { label: string; value: ReactNode; hint?: string }) {
  return (
    <div className="stat">
      <div className="stat-label">{label}</div>
      <div className="stat-value">{value}</div>
      {hint && <div className="stat-hint">{hint}</div>}
    </div>
  );
}

export function Badge({ tone, children }: { tone: "ok" | "warn" | "bad" | "info" | "muted"; children: ReactNode }) {
  return <span className={`badge badge-${tone}`}>{children}</span>;
}

export function stateTone(state: string): "ok" | "warn" | "bad" | "info" | "muted" {
  if (["running", "active", "completed"].includes(state)) return "ok";
  if (["pending", "deploying", "expiring", "in_progress", "validating", "finalizing", "cancelling"].includes(state)) return "info";
  if (["unhealthy", "cancelled"].includes(state)) return "warn";
  if (["failed", "revoked", "expired", "suspended"].includes(state)) return "bad";
  return "muted";
}

/** How far a piece of work has come: ``done`` of ``total`` as a bar (the part of it that failed in red) and in figures. */
export function Progress({ done, failed = 0, total, label }: { done: number; failed?: number; total: number; label: string }) {
  const pct = (n: number) => (total > 0 ? Math.min(100, (n / total) * 100) : 0);
  return (
    <span className="progress">
      <span className="progress-bar" role="progressbar" aria-label={label} aria-valuemin={0} aria-valuemax={total} aria-valuenow={done + failed}>
        <span className="progress-done" style={{ width: `${pct(done)}%` }} />
        <span className="progress-failed" style={{ width: `${pct(failed)}%` }} />
      </span>
      <span className="progress-text">
        {fmtInt(done + failed)} of {fmtInt(total)}
        {failed > 0 && <span className="bad-text"> ({fmtInt(failed)} failed)</span>}
      </span>
    </span>
  );
}

/** A new secret, shown once: focused when it appears, with a copy button, until the person says it is saved. */
export function SecretOnce({ id, title, label, copyLabel, secret, children, onDone }: {
  id: string; title: string; label: string; copyLabel: string; secret: string; children: ReactNode; onDone: () => void;
}) {
  const ref = useRef<HTMLDivElement>(null);
  useEffect(() => ref.current?.focus(), []);
  return (
    <div className="card secret" role="region" aria-labelledby={`${id}-title`} tabIndex={-1} ref={ref}>
      <h2 id={`${id}-title`}>{title}</h2>
      <p>{children}</p>
      <div className="secret-row">
        <label htmlFor={id} className="sr-only">
          {label}
        </label>
        <input id={id} readOnly value={secret} onFocus={(e) => e.target.select()} data-testid={id} />
        <CopyButton text={secret} label={copyLabel} />
      </div>
      <button type="button" onClick={onDone}>
        I have saved it
      </button>
    </div>
  );
}

export function CopyButton({ text, label = "Copy" }: { text: string; label?: string }) {
  const [done, setDone] = useState<"" | "ok" | "fail">("");
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(text);
      setDone("ok");
    } catch {
      setDone("fail");
    }
  };
  return (
    <>
      <button type="button" className="secondary" onClick={copy}>
        {done === "ok" ? "Copied" : label}
      </button>
      <span role="status" aria-live="polite" className="sr-only">
        {done === "ok" ? "Copied to the clipboard." : done === "fail" ? "Copy failed; select the text and copy it." : ""}
      </span>
    </>
  );
}

// --- formatting ---------------------------------------------------------------------------------

export const fmtInt = (n: number | null | undefined) => (n === null || n === undefined ? "–" : n.toLocaleString("en-US"));
export const fmtMs = (n: number | null | undefined) =>
  n === null || n === undefined ? "–" : n < 10 ? `${n.toFixed(2)} ms` : n < 1000 ? `${n.toFixed(1)} ms` : `${(n / 1000).toFixed(2)} s`;
export const fmtPct = (n: number | null | undefined) => (n === null || n === undefined ? "–" : `${(n * 100).toFixed(1)} %`);
export const fmtTime = (iso: string | null | undefined) =>
  iso ? new Date(iso).toLocaleString("en-GB", { day: "numeric", month: "short", year: "numeric", hour: "2-digit", minute: "2-digit", hour12: false }) : "–";
/** A time the OpenAI-shaped records give in Unix seconds. */
export const fmtEpoch = (s: number | null | undefined) => (s === null || s === undefined ? "–" : fmtTime(new Date(s * 1000).toISOString()));
export function fmtBytes(n: number | null | undefined) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// --- charts -------------------------------------------------------------------------------------

export interface Series {
  name: string;
  color: string;
}

/** Stacked bars, one per point, with a y axis and a data table for screen readers. */
export function BarChart({
  title,
  labels,
  series,
  values,
  height = 200,
  unit = "",
}: {
  title: string;
  labels: string[];
  series: Series[];
  values: number[][]; // [point][series]
  height?: number;
  unit?: string;
}) {
  const ref = useRef<HTMLElement | null>(null);
  // drawn at the container's own width, so that 12 px labels stay 12 px on a phone
  const width = useWidth(ref, 720);
  const pad = { l: 52, r: 12, t: 12, b: 30 };
  const totals = values.map((v) => v.reduce((a, b) => a + b, 0));
  const max = Math.max(1, ...totals);
  const step = wholeStep(max / 4); // counts: whole-number ticks only, never half a request
  const nice = step * Math.max(1, Math.ceil(max / step));
  const innerW = width - pad.l - pad.r;
  const innerH = height - pad.t - pad.b;
  const bw = innerW / Math.max(1, labels.length);
  const ticks = Array.from({ length: Math.round(nice / step) + 1 }, (_, i) => i * step);
  const every = Math.max(1, Math.ceil(labels.length / Math.max(2, Math.floor(innerW / 70))));
  return (
    <figure className="chart" ref={ref}>
      <figcaption>{title}</figcaption>
      <svg viewBox={`0 0 ${width} ${height}`} role="img" aria-label={`${title}: total ${fmtInt(totals.reduce((a, b) => a + b, 0))}${unit}`}>
        {ticks.map((t) => {
          const y = pad.t + innerH - (t / nice) * innerH;
          return (
            <g key={t}>
              <line x1={pad.l} x2={width - pad.r} y1={y} y2={y} className="grid" />
              <text x={pad.l - 6} y={y + 4} textAnchor="end" className="axis">
                {compact(t)}
              </text>
            </g>
          );
        })}
        {values.map((v, i) => {
          let y = pad.t + innerH;
          return (
            <g key={i}>
              {v.map((val, s) => {
                const h = (val / nice) * innerH;
                y -= h;
                return (
                  <rect key={s} x={pad.l + i * bw + bw * 0.12} y={y} width={bw * 0.76} height={Math.max(0, h)} fill={series[s].color}>
                    <title>{`${labels[i]} · ${series[s].name}: ${fmtInt(val)}${unit}`}</title>
                  </rect>
                );
              })}
              {i % every === 0 && (
                <text x={pad.l + i * bw + bw / 2} y={height - 8} textAnchor="middle" className="axis">
                  {labels[i]}
                </text>
              )}
            </g>
          );
        })}
      </svg>
      <ul className="legend">
        {series.map((s) => (
          <li key={s.name}>
            <span className="swatch" style={{ background: s.color }} aria-hidden="true" />
            {s.name}
          </li>
        ))}
      </ul>
      <details className="data-table">
        <summary>Show the data as a table</summary>
        <table>
          <thead>
            <tr>
              <th scope="col">Time</th>
              {series.map((s) => (
                <th scope="col" key={s.name}>
                  {s.name}
                </th>
              ))}
            </tr>
          </thead>
          <tbody>
            {labels.map((l, i) => (
              <tr key={i}>
                <th scope="row">{l}</th>
                {values[i].map((v, s) => (
                  <td key={s}>{fmtInt(v)}</td>
                ))}
              </tr>
            ))}
          </tbody>
        </table>
      </details>
    </figure>
  );
}

/** The width of ``ref``'s element in CSS pixels, followed as it resizes (``fallback`` before layout). */
function useWidth(ref: RefObject<HTMLElement | null>, fallback: number) {
  const [w, setW] = useState(fallback);
  useEffect(() => {
    const el = ref.current;
    if (!el || typeof ResizeObserver === "undefined") return;
    const ro = new ResizeObserver(() => setW(Math.max(240, Math.floor(el.clientWidth - 32))));
    ro.observe(el);
    return () => ro.disconnect();
  }, [ref]);
  return w;
}

/** A whole-number tick step of 1, 2 or 5 times a power of ten, at least ``raw``. */
function wholeStep(raw: number) {
  if (raw <= 1) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return Math.max(1, Math.round(m * p));
  return 10 * p;
}

function compact(n: number) {
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(n >= 1e4 ? 0 : 1)}k`;
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

/** One request's phases on a shared time axis. */
export function Waterfall({ spans, total }: { spans: Span[]; total: number }) {
  const end = Math.max(total, ...spans.map((s) => s.start_ms + s.duration_ms), 0.001);
  return (
    <figure className="waterfall" aria-label="Trace waterfall">
      <figcaption>Trace waterfall (0 – {fmtMs(end)})</figcaption>
      <ol>
        {spans.map((s, i) => (
          <li key={i} className={`wf-row wf-${s.kind}`}>
            <span className="wf-name">{s.name}</span>
            <span className="wf-track" aria-hidden="true">
              <span
                className="wf-bar"
                style={{ left: `${(s.start_ms / end) * 100}%`, width: `${Math.max(0.4, (s.duration_ms / end) * 100)}%` }}
              />
            </span>
            <span className="wf-time">
              {fmtMs(s.duration_ms)} <span className="muted">at {fmtMs(s.start_ms)}</span>
            </span>
            {s.detail && <span className="wf-detail">{s.detail}</span>}
          </li>
        ))}
      </ol>
    </figure>
  );
}
