// The operator's Queues page: the gateway's flow-control queues per model, all gateway processes together.
import { type FlowModel, type FlowOverview } from "./api";
import { Badge, Empty, ErrorMessage, Loading, Page, Stat, TableHead, fmtInt, fmtMs, fmtPct, useApi } from "./components";

const POLL_MS = 3000;

const REASONS: Record<string, string> = {
  queue_full: "queue full",
  ttl: "waited too long",
  backlog: "would wait too long",
  slo: "would miss TTFT",
};

export function reasonLabel(reason: string) {
  return REASONS[reason] ?? reason;
}

function Refusals({ rejected }: { rejected: Record<string, number> }) {
  const items = Object.entries(rejected).filter(([, n]) => n > 0);
  if (!items.length) return <>–</>;
  return (
    <span className="row">
      {items.map(([reason, n]) => (
        <Badge key={reason} tone="warn">
          {fmtInt(n)} {reasonLabel(reason)}
        </Badge>
      ))}
    </span>
  );
}

const fmtS = (s: number | null | undefined) => (s === null || s === undefined ? "–" : fmtMs(s * 1000));

function ModelQueue({ m }: { m: FlowModel }) {
  const captionId = `queue-${m.model}`;
  return (
    <section className="card" aria-labelledby={captionId} data-model={m.model}>
      <div className="row-between">
        <h2 id={captionId}>
          <code>{m.model}</code>
        </h2>
        {m.waiting > 0 ? <Badge tone="warn">{fmtInt(m.waiting)} waiting</Badge> : <Badge tone="ok">no queue</Badge>}
      </div>
      <div className="stats">
        <Stat label="Limit" value={m.limit === null ? "none yet" : fmtInt(m.limit)} hint={m.limit === null ? "limits only until latencies are measured" : "requests upstream at once"} />
        <Stat label="Running" value={fmtInt(m.running)} />
        <Stat label="Waiting" value={fmtInt(m.waiting)} />
        <Stat label="Started per second" value={m.dispatch_per_s === null ? "–" : m.dispatch_per_s.toFixed(2)} />
      </div>
      <table className="table">
        <caption className="sr-only">Waiting per priority band of {m.model}</caption>
        <TableHead cols={["Priority band", "Waiting"]} />
        <tbody>
          {m.bands.length === 0 && (
            <tr>
              <td colSpan={2} className="muted">
                Nothing has waited yet.
              </td>
            </tr>
          )}
          {m.bands.map((b) => (
            <tr key={b.priority}>
              <th scope="row">{b.priority}</th>
              <td>{fmtInt(b.waiting)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h3>Tenants</h3>
      {m.tenants.length === 0 ? (
        <Empty>No tenant has sent requests to this model since the gateways started.</Empty>
      ) : (
        <table className="table">
          <caption className="sr-only">Tenants on {m.model}</caption>
          <TableHead cols={["Tenant", "Running", "Waiting", "Prompt tokens", "Generated tokens", "Share of tokens", "Time queued", "Refused"]} />
          <tbody>
            {m.tenants.map((t) => (
              <tr key={t.tenant_id}>
                <th scope="row">{t.display_name ?? t.tenant_name ?? <code>{t.tenant_id.slice(0, 8)}</code>}</th>
                <td>{fmtInt(t.running)}</td>
                <td>{fmtInt(t.waiting)}</td>
                <td>{fmtInt(t.prompt_tokens)}</td>
                <td>{fmtInt(t.completion_tokens)}</td>
                <td>{fmtPct(t.token_share)}</td>
                <td>{fmtS(t.queued_s)}</td>
                <td>
                  <Refusals rejected={t.rejected} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <h3>Engines</h3>
      {m.engines.length === 0 ? (
        <Empty>No engine of this model has reported its load lately (an engine reports while it steps).</Empty>
      ) : (
        <table className="table">
          <caption className="sr-only">Engines of {m.model}, as their load reports say</caption>
          <TableHead cols={["Engine", "Pool", "Running", "Waiting in the engine", "KV cache", "Reported"]} />
          <tbody>
            {m.engines.map((e) => (
              <tr key={e.engine}>
                <th scope="row">
                  <code>{e.engine}</code>
                </th>
                <td>{e.role}</td>
                <td>{e.running.toFixed(1)}</td>
                <td>{e.waiting >= 1 ? <Badge tone="warn">{e.waiting.toFixed(1)}</Badge> : e.waiting.toFixed(1)}</td>
                <td>{fmtPct(e.kv_usage)}</td>
                <td>{fmtS(e.age_s)} ago</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {m.processes.some((p) => p.engine_pressure) && (
        <p className="muted">
          Held down by the engines: {[...new Set(m.processes.map((p) => p.engine_pressure).filter(Boolean))].join("; ")}
        </p>
      )}
      <details className="data-table">
        <summary>Per gateway process</summary>
        <table className="table">
          <caption className="sr-only">Each gateway process's queue of {m.model}</caption>
          <TableHead cols={["Process", "Limit", "Running", "Waiting", "Started/s", "Upstream TTFT", "Gradient", "TPOT (floor)"]} />
          <tbody>
            {m.processes.map((p) => (
              <tr key={p.process}>
                <th scope="row">
                  <code>{p.process}</code>
                </th>
                <td>
                  {p.limit === null ? "none yet" : fmtInt(p.limit)}
                  {p.part === null ? "" : ` (part ${p.part.toFixed(2)})`}
                </td>
                <td>{fmtInt(p.running)}</td>
                <td>{fmtInt(p.waiting)}</td>
                <td>{p.dispatch_per_s === null ? "–" : p.dispatch_per_s.toFixed(2)}</td>
                <td>{fmtS(p.upstream_ttft_s)}</td>
                <td>{p.gradient === null ? "–" : p.gradient.toFixed(2)}</td>
                <td>
                  {fmtS(p.tpot_s)} ({fmtS(p.tpot_floor_s)})
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </details>
    </section>
  );
}

export function Queues() {
  const flow = useApi<FlowOverview>("/ops/flow", [], POLL_MS);
  const d = flow.data;
  const waiting = d ? d.models.reduce((a, m) => a + m.waiting, 0) : 0;
  const running = d ? d.models.reduce((a, m) => a + m.running, 0) : 0;
  return (
    <Page
      title="Queues"
      intro="The gateway's flow control per model, all gateway processes together: the learned limit, what runs, what waits per priority band, and each tenant's share. Refreshes every few seconds; tenant totals count since each gateway process started."
    >
      <ErrorMessage error={flow.error} />
      {flow.loading && !d && <Loading what="the queues" />}
      {d && (
        <div className="stats">
          <Stat label="Gateway processes" value={fmtInt(d.processes.length)} />
          <Stat label="Models" value={fmtInt(d.models.length)} />
          <Stat label="Running" value={fmtInt(running)} />
          <Stat label="Waiting" value={fmtInt(waiting)} />
        </div>
      )}
      {d && d.models.length === 0 && <Empty>No gateway process has reported a queue yet: one does once a model has had traffic.</Empty>}
      {d?.models.map((m) => <ModelQueue key={m.model} m={m} />)}
    </Page>
  );
}
