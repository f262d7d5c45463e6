import { useEffect, useRef, useState, type FormEvent } from "react";
import {
  ApiError,
  api,
  type AccessRequest,
  type ApiKey,
  type Batch,
  type BatchList,
  type CatalogueModel,
  type FlowLevel,
  type IssuedKey,
  type RequestDetail,
  type RequestRow,
  type SessionInfo,
  type SloModel,
  type TenantModel,
  type Usage,
} from "./api";
import {
  Badge,
  BarChart,
  Empty,
  ErrorMessage,
  Loaded,
  Loading,
  Page,
  Pager,
  Progress,
  RowButton,
  SecretOnce,
  Stat,
  Table,
  TableHead,
  Waterfall,
  fmtBytes,
  fmtEpoch,
  fmtInt,
  fmtMs,
  fmtPct,
  fmtTime,
  stateTone,
  useAction,
  useApi,
} from "./components";
import { StreamError, streamChat } from "./sse";
import { reasonLabel } from "./queues";
import { Link } from "./router";

// --- overview -----------------------------------------------------------------------------------

export function Overview({ session }: { session: SessionInfo }) {
  const ov = useApi<{
    models: number;
    live_keys: number;
    usage_24h: Usage["totals"];
    access?: { state: "ready" | "waiting"; since: string; pending: AccessRequest[] };
    models_granted?: string[];
  }>("/tenant/overview");
  const ask = useAction(() => ov.reload());
  const pending = ov.data?.access?.pending ?? [];
  const waiting = ov.data?.access?.state === "waiting";
  const firstModel = ov.data?.models_granted?.[0] ?? "MODEL";
  const usage = useApi<Usage>("/tenant/usage?hours=24");
  return (
    <Page title={`Welcome, ${session.tenant?.display_name ?? ""}`} intro="Your keys, models and traffic at a glance.">
      <ErrorMessage error={ov.error} />
      {ov.data && (
        <div className="stats">
          <Stat label="Models you may use" value={fmtInt(ov.data.models)} />
          <Stat label="Live API keys" value={fmtInt(ov.data.live_keys)} />
          <Stat label="Requests, last 24 h" value={fmtInt(ov.data.usage_24h.requests)} />
          <Stat label="Tokens, last 24 h" value={fmtInt(ov.data.usage_24h.prompt_tokens + ov.data.usage_24h.completion_tokens)} />
        </div>
      )}
      {waiting && (
        <div className="card no-plan" role="status" data-testid="access-waiting">
          <h2>Waiting for access</h2>
          <p>
            Your organisation is set up, but no model has been granted to it yet. Once an operator grants one, it appears
            under <Link to="/models">Models</Link> and your keys can call it. You can create keys now.
          </p>
          {pending.length > 0 ? (
            <p data-testid="access-pending">
              Your request for {pending[0].model ? <code>{pending[0].model}</code> : "a model"} is with the operators since{" "}
              {fmtTime(pending[0].requested_at)}.
            </p>
          ) : session.user.role === "tenant_member" ? (
            <p className="muted">An admin of your organisation can ask the operators for access.</p>
          ) : (
            <p>
              <button type="button" disabled={ask.busy} onClick={() => ask.run(() => api("/tenant/access-requests", { method: "POST", body: {} }))}>
                Ask the operators for access
              </button>
            </p>
          )}
          <ErrorMessage error={ask.error} />
        </div>
      )}
      {usage.data && <UsageCharts usage={usage.data} />}
      <div className="card">
        <h2>Get started</h2>
        <ol>
          <li>
            {session.user.role === "tenant_member" ? (
              <>Ask an admin of your organisation for an API key (or try a model in the <Link to="/playground">playground</Link>).</>
            ) : (
              <><Link to="/keys">Create an API key</Link> scoped to the models you need.</>
            )}
          </li>
          <li>
            Point any OpenAI client at <code>{window.location.origin}/v1</code> with that key:
            <pre className="snippet">
              {`from openai import OpenAI\nclient = OpenAI(base_url="${window.location.origin}/v1", api_key="YOUR_KEY")\n` +
                `client.chat.completions.create(model="${firstModel}", messages=[{"role": "user", "content": "hi"}])`}
            </pre>
          </li>
          <li>
            Try a model in the <Link to="/playground">playground</Link>, then watch <Link to="/usage">usage</Link> and{" "}
            <Link to="/requests">requests</Link>.
          </li>
        </ol>
      </div>
    </Page>
  );
}

// --- keys ---------------------------------------------------------------------------------------

const MEMBER_NOTE = "You are a member of this organisation: its admins create, rotate and revoke keys and ask for models.";

export function Keys({ canManage }: { canManage: boolean }) {
  const [showRevoked, setShowRevoked] = useState(false);
  const keys = useApi<ApiKey[]>(`/tenant/keys?include_revoked=${showRevoked}`, [showRevoked]);
  const models = useApi<TenantModel[]>("/tenant/models");
  const [issued, setIssued] = useState<{ secret: string; name: string; rotated: boolean } | null>(null);
  const [actionError, setActionError] = useState<ApiError | null>(null);

  const revoke = async (k: ApiKey) => {
    if (!window.confirm(`Revoke the key “${k.name}” (${k.prefix}…)? Requests with it fail at once.`)) return;
    setActionError(null);
    try {
      await api(`/tenant/keys/${k.id}/revoke`, { method: "POST" });
      keys.reload();
    } catch (e) {
      setActionError(e as ApiError);
    }
  };
  const rotate = async (k: ApiKey) => {
    setActionError(null);
    try {
      const r = await api<IssuedKey>(`/tenant/keys/${k.id}/rotate`, { method: "POST", body: { overlap_hours: 24 } });
      setIssued({ secret: r.secret, name: r.key.name, rotated: true });
      keys.reload();
    } catch (e) {
      setActionError(e as ApiError);
    }
  };

  return (
    <Page title="API keys" intro="Keys authenticate calls to the OpenAI-compatible API. Baton keeps only a hash: a secret is shown once.">
      {issued && (
        <SecretOnce id="secret-value" title={issued.rotated ? `New secret for “${issued.name}”` : `Your new key “${issued.name}”`}
          label="Secret key" copyLabel="Copy key" secret={issued.secret} onDone={() => setIssued(null)}>
          Copy it now: Baton shows it <strong>only once</strong> and cannot recover it.
          {issued.rotated && " The previous secret keeps working for 24 hours, then expires."}
        </SecretOnce>
      )}
      {canManage ? (
        <CreateKey models={models.data ?? []} onCreated={(r) => { setIssued({ secret: r.secret, name: r.key.name, rotated: false }); keys.reload(); }} />
      ) : (
        <p className="muted" data-testid="member-note">{MEMBER_NOTE}</p>
      )}
      <div className="card">
        <div className="row-between">
          <h2>Your keys</h2>
          <label className="inline">
            <input type="checkbox" checked={showRevoked} onChange={(e) => setShowRevoked(e.target.checked)} /> Show revoked keys
          </label>
        </div>
        <ErrorMessage error={actionError} />
        <ErrorMessage error={keys.error} />
        {keys.loading && !keys.data && <Loading what="keys" />}
        {keys.data && keys.data.length === 0 && <Empty>No keys yet. Create one above.</Empty>}
        {keys.data && keys.data.length > 0 && (
          <table className="table">
            <caption className="sr-only">API keys</caption>
            <TableHead cols={["Name", "Key", "Models", "State", "Expires", "Last used"]} actions={canManage ? "Actions" : undefined} />
            <tbody>
              {keys.data.map((k) => (
                <tr key={k.id}>
                  <th scope="row">{k.name}</th>
                  <td>
                    <code>{k.prefix}…</code>
                  </td>
                  <td>{k.model_scope.length ? k.model_scope.join(", ") : <span className="muted">all your models</span>}</td>
                  <td>
                    <Badge tone={k.rotated_to_id && k.state === "expiring" ? "warn" : stateTone(k.state === "expiring" ? "active" : k.state)}>
                      {k.rotated_to_id && k.state === "expiring" ? "rotated, expiring" : k.state === "expiring" ? "active" : k.state}
                    </Badge>
                  </td>
                  <td>{fmtTime(k.expires_at)}</td>
                  <td>{fmtTime(k.last_used_at)}</td>
                  {canManage && <td className="actions">
                    {k.state !== "revoked" && k.state !== "expired" && !k.rotated_to_id && (
                      <button type="button" className="secondary" onClick={() => rotate(k)} aria-label={`Rotate key ${k.name}`}>
                        Rotate
                      </button>
                    )}
                    {k.state !== "revoked" && (
                      <button type="button" className="danger" onClick={() => revoke(k)} aria-label={`Revoke key ${k.name}`}>
                        Revoke
                      </button>
                    )}
                  </td>}
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </div>
    </Page>
  );
}

function CreateKey({ models, onCreated }: { models: TenantModel[]; onCreated: (k: IssuedKey) => void }) {
  const [name, setName] = useState("");
  const [scope, setScope] = useState<string[]>([]);
  const [expires, setExpires] = useState("90");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const r = await api<IssuedKey>("/tenant/keys", {
        method: "POST",
        body: { name, model_scope: scope, expires_in_days: expires === "never" ? null : Number(expires) },
      });
      setName("");
      setScope([]);
      onCreated(r);
    } catch (err) {
      setError(err as ApiError);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form className="card form" onSubmit={submit} aria-labelledby="create-key-title">
      <h2 id="create-key-title">Create a key</h2>
      <div className="grid-3">
        <div>
          <label htmlFor="key-name">Name</label>
          <input id="key-name" required maxLength={100} value={name} onChange={(e) => setName(e.target.value)} placeholder="e.g. production" />
        </div>
        <fieldset>
          <legend>Models</legend>
          {models.length === 0 && (
            <p className="hint">
              Your organisation is waiting for access to a model. The key you make now works as soon as an operator grants one.
            </p>
          )}
          {models.map((m) => (
            <label className="inline" key={m.id}>
              <input
                type="checkbox"
                checked={scope.includes(m.name)}
                onChange={(e) => setScope(e.target.checked ? [...scope, m.name] : scope.filter((s) => s !== m.name))}
              />{" "}
              {m.name}
            </label>
          ))}
          {models.length > 0 && <p className="hint">None ticked: every model you may use, now and later.</p>}
        </fieldset>
        <div>
          <label htmlFor="key-expiry">Expires</label>
          <select id="key-expiry" value={expires} onChange={(e) => setExpires(e.target.value)}>
            <option value="7">in 7 days</option>
            <option value="30">in 30 days</option>
            <option value="90">in 90 days</option>
            <option value="365">in a year</option>
            <option value="never">never</option>
          </select>
        </div>
      </div>
      <ErrorMessage error={error} title="Could not create the key" />
      <button type="submit" disabled={busy}>
        {busy ? "Creating…" : "Create key"}
      </button>
    </form>
  );
}

// --- models -------------------------------------------------------------------------------------

function Catalogue({ onAsked, canManage }: { onAsked: () => void; canManage: boolean }) {
  const cat = useApi<CatalogueModel[]>("/tenant/catalogue");
  const mine = useApi<AccessRequest[]>("/tenant/access-requests");
  const ask = useAction(() => {
    cat.reload();
    mine.reload();
    onAsked();
  });
  const others = (cat.data ?? []).filter((m) => !m.granted);
  const answered = (mine.data ?? []).filter((r) => r.state !== "pending").slice(0, 5);
  return (
    <div className="card" data-testid="catalogue">
      <h2 id="catalogue-title">Other models on the platform</h2>
      <ErrorMessage error={cat.error ?? ask.error} />
      {cat.data && others.length === 0 && <p className="muted">Your organisation may use every model on the platform.</p>}
      {others.length > 0 && (
        <table className="table" aria-labelledby="catalogue-title">
          <TableHead cols={["Model", "Context"]} actions="Access" />
          <tbody>
            {others.map((m) => (
              <tr key={m.id}>
                <th scope="row">
                  <code>{m.name}</code>
                </th>
                <td>{fmtInt(m.context_length)} tokens</td>
                <td className="actions">
                  {m.requested ? (
                    <Badge tone="info">requested</Badge>
                  ) : !canManage ? (
                    <span className="muted">ask an admin</span>
                  ) : (
                    <button type="button" className="secondary" disabled={ask.busy}
                      onClick={() => ask.run(() => api("/tenant/access-requests", { method: "POST", body: { model_id: m.id } }))}>
                      Request access <span className="sr-only">to {m.name}</span>
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {answered.length > 0 && (
        <>
          <h3>Answered requests</h3>
          <ul data-testid="answered-requests">
            {answered.map((r) => (
              <li key={r.id}>
                {r.model ? <code>{r.model}</code> : "A model"}: {r.state === "approved" ? <Badge tone="ok">approved</Badge> : <Badge tone="bad">declined</Badge>}{" "}
                {fmtTime(r.resolved_at)}
                {r.reason ? ` — “${r.reason}”` : ""}
              </li>
            ))}
          </ul>
        </>
      )}
    </div>
  );
}

export function Models({ canManage }: { canManage: boolean }) {
  const models = useApi<TenantModel[]>("/tenant/models");
  return (
    <Page title="Models" intro="The models your organisation may call, and the service level that applies to each.">
      <ErrorMessage error={models.error} />
      {models.loading && !models.data && <Loading what="models" />}
      {models.data && models.data.length === 0 && <Empty>No models are granted to your organisation yet. Ask for one below.</Empty>}
      {models.data && models.data.length > 0 && (
        <table className="table card">
          <caption className="sr-only">Models</caption>
          <TableHead cols={["Model", "Status", "Context", "Type", "SLO"]} />
          <tbody>
            {models.data.map((m) => (
              <tr key={m.id}>
                <th scope="row">
                  <code>{m.name}</code>
                </th>
                <td>{m.available ? <Badge tone="ok">serving</Badge> : <Badge tone="muted">not deployed</Badge>}</td>
                <td>{fmtInt(m.context_length)} tokens</td>
                <td>
                  {m.dtype}
                  {m.params_b ? `, ${m.params_b} B params` : ""}
                </td>
                <td>{m.slo ? `${m.slo.name}: TTFT ≤ ${m.slo.ttft_ms} ms, TPOT ≤ ${m.slo.tpot_ms} ms` : <span className="muted">none</span>}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <Catalogue onAsked={() => models.reload()} canManage={canManage} />
    </Page>
  );
}

// --- usage --------------------------------------------------------------------------------------

function label(t: string, bucket: "hour" | "day") {
  const d = new Date(t);
  return bucket === "hour"
    ? d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit", hour12: false })
    : d.toLocaleDateString("en-GB", { day: "2-digit", month: "short" });
}

function UsageCharts({ usage }: { usage: Usage }) {
  const labels = usage.series.map((p) => label(p.t, usage.bucket));
  return (
    <div className="charts">
      <BarChart
        title={`Requests per ${usage.bucket}`}
        labels={labels}
        series={[{ name: "requests", color: "#2563eb" }]}
        values={usage.series.map((p) => [p.requests])}
      />
      <BarChart
        title={`Tokens per ${usage.bucket}`}
        labels={labels}
        series={[
          { name: "prompt tokens", color: "#7c3aed" },
          { name: "completion tokens", color: "#059669" },
        ]}
        values={usage.series.map((p) => [p.prompt_tokens, p.completion_tokens])}
      />
    </div>
  );
}

export function UsagePage() {
  const [hours, setHours] = useState(24);
  const usage = useApi<Usage>(`/tenant/usage?hours=${hours}`, [hours], 15000);
  return (
    <Page
      title="Usage"
      intro="Requests and tokens over time, from the gateway's metering."
      actions={
        <div>
          <label htmlFor="usage-range">Period</label>{" "}
          <select id="usage-range" value={hours} onChange={(e) => setHours(Number(e.target.value))}>
            <option value={6}>last 6 hours</option>
            <option value={24}>last 24 hours</option>
            <option value={72}>last 3 days</option>
            <option value={24 * 30}>last 30 days</option>
          </select>
        </div>
      }
    >
      <ErrorMessage error={usage.error} />
      {usage.loading && !usage.data && <Loading what="usage" />}
      {usage.data && (
        <>
          <div className="stats">
            <Stat label="Requests" value={fmtInt(usage.data.totals.requests)} />
            <Stat label="Prompt tokens" value={fmtInt(usage.data.totals.prompt_tokens)} />
            <Stat label="Completion tokens" value={fmtInt(usage.data.totals.completion_tokens)} />
            <Stat label="Cached prompt tokens" value={fmtInt(usage.data.totals.cached_tokens)} />
          </div>
          <UsageCharts usage={usage.data} />
          <div className="card">
            <h2>By model</h2>
            {usage.data.by_model.length === 0 ? (
              <Empty>No requests in this period.</Empty>
            ) : (
              <table className="table">
                <TableHead cols={["Model", "Requests", "Prompt tokens", "Completion tokens"]} />
                <tbody>
                  {usage.data.by_model.map((m) => (
                    <tr key={m.model}>
                      <th scope="row">{m.model}</th>
                      <td>{fmtInt(m.requests)}</td>
                      <td>{fmtInt(m.prompt_tokens)}</td>
                      <td>{fmtInt(m.completion_tokens)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            )}
          </div>
        </>
      )}
    </Page>
  );
}

// --- SLOs ---------------------------------------------------------------------------------------

function Target({ value, target }: { value: number | null; target: number | undefined }) {
  if (value === null) return <>–</>;
  if (target === undefined) return <>{fmtMs(value)}</>;
  const ok = value <= target;
  return (
    <span className={ok ? "ok-text" : "bad-text"}>
      {fmtMs(value)} <span className="sr-only">{ok ? "(within target)" : "(over target)"}</span>
      <span aria-hidden="true">{ok ? " ✓" : " ✗"}</span>
    </span>
  );
}

/** Flow control on the organisation's requests: queue wait, refusals, SLO classes and TTFT met. */
function FlowLevels({ hours }: { hours: number }) {
  const flow = useApi<{ models: FlowLevel[] }>(`/tenant/flow?hours=${hours}`, [hours], 15000);
  return (
    <section className="card" aria-labelledby="flow-title">
      <h2 id="flow-title">Queueing and refusals</h2>
      <p className="muted small">
        When a model is busy the gateway queues requests by SLO class and refuses some ({reasonLabel("queue_full")}, {reasonLabel("ttl")}, {reasonLabel("backlog")}, {reasonLabel("slo")}) with HTTP 429
        <code> model_overloaded</code>; retry those after the <code>Retry-After</code> they carry.
      </p>
      <ErrorMessage error={flow.error} />
      {flow.loading && !flow.data && <Loading what="queueing figures" />}
      {flow.data && flow.data.models.length === 0 && <Empty>No requests in this period.</Empty>}
      {flow.data && flow.data.models.length > 0 && (
        <table className="table">
          <caption className="sr-only">Queue wait and refusals per model and SLO class</caption>
          <TableHead cols={["Model", "Policy / SLO class", "Requests", "Queue wait p50", "Queue wait p99", "Refused (429)", "Met TTFT target"]} />
          <tbody>
            {flow.data.models.map((m) => [
              <tr key={m.model}>
                <th scope="row">
                  <code>{m.model}</code>
                </th>
                <td>{m.policy ? `${m.policy.name} (TTFT ≤ ${m.policy.ttft_ms} ms)` : <span className="muted">no policy</span>}</td>
                <td>{fmtInt(m.requests)}</td>
                <td>{fmtMs(m.queue_ms.p50)}</td>
                <td>{fmtMs(m.queue_ms.p99)}</td>
                <td>{m.refused ? <Badge tone="warn">{fmtInt(m.refused)}</Badge> : "0"}{m.unavailable ? <span className="muted"> + {fmtInt(m.unavailable)} unavailable (503)</span> : null}</td>
                <td>{m.ttft_attainment === null ? "–" : `${fmtPct(m.ttft_attainment)} (${fmtInt(m.ttft_met)})`}</td>
              </tr>,
              ...m.classes.map((c) => (
                <tr key={`${m.model}/${c.flow_class ?? ""}`}>
                  <td>
                    <span className="sr-only">{m.model}, class</span>
                  </td>
                  <td>{c.flow_class ?? <span className="muted">none (flow control off)</span>}</td>
                  <td>{fmtInt(c.requests)}</td>
                  <td>{fmtMs(c.queue_ms.p50)}</td>
                  <td>{fmtMs(c.queue_ms.p99)}</td>
                  <td>{fmtInt(c.refused)}</td>
                  <td>–</td>
                </tr>
              )),
            ])}
          </tbody>
        </table>
      )}
    </section>
  );
}

export function SloPage() {
  const [hours, setHours] = useState(24);
  const slo = useApi<{ models: SloModel[]; window_s: number }>(`/tenant/slo?hours=${hours}`, [hours], 15000);
  return (
    <Page
      title="Service levels"
      intro="Time to first token (TTFT) and time per output token (TPOT) against your policy. Goodput counts the requests that met both."
      actions={
        <div>
          <label htmlFor="slo-range">Period</label>{" "}
          <select id="slo-range" value={hours} onChange={(e) => setHours(Number(e.target.value))}>
            <option value={1}>last hour</option>
            <option value={24}>last 24 hours</option>
            <option value={24 * 7}>last 7 days</option>
          </select>
        </div>
      }
    >
      <ErrorMessage error={slo.error} />
      {slo.loading && !slo.data && <Loading what="service levels" />}
      {slo.data && slo.data.models.length === 0 && <Empty>No requests in this period.</Empty>}
      {slo.data?.models.map((m) => (
        <div className="card" key={m.model}>
          <div className="row-between">
            <h2>
              <code>{m.model}</code>
            </h2>
            {m.policy ? (
              <span className="muted">
                Policy {m.policy.name}: TTFT ≤ {m.policy.ttft_ms} ms, TPOT ≤ {m.policy.tpot_ms} ms at p{m.policy.percentile}
              </span>
            ) : (
              <span className="muted">No SLO policy applies to this model.</span>
            )}
          </div>
          <div className="stats">
            <Stat label="Requests" value={fmtInt(m.requests)} hint={`${fmtInt(m.completed)} completed`} />
            <Stat label="SLO attainment" value={fmtPct(m.attainment)} hint={m.good !== null ? `${fmtInt(m.good)} met both targets` : undefined} />
            <Stat label="Goodput" value={m.goodput_rps !== null ? `${m.goodput_rps.toFixed(4)} req/s` : "–"} hint="requests within SLO per second" />
          </div>
          {m.attainment !== null && (
            <div className="meter" role="meter" aria-label="SLO attainment" aria-valuemin={0} aria-valuemax={100} aria-valuenow={Math.round(m.attainment * 100)}>
              <span style={{ width: `${m.attainment * 100}%` }} />
            </div>
          )}
          <table className="table">
            <TableHead cols={["Metric", "p50", "p90", "p99", "Target"]} />
            <tbody>
              <tr>
                <th scope="row">TTFT</th>
                <td><Target value={m.ttft_ms.p50} target={m.policy?.ttft_ms} /></td>
                <td><Target value={m.ttft_ms.p90} target={m.policy?.ttft_ms} /></td>
                <td><Target value={m.ttft_ms.p99} target={m.policy?.ttft_ms} /></td>
                <td>{m.policy ? `${m.policy.ttft_ms} ms` : "–"}</td>
              </tr>
              <tr>
                <th scope="row">TPOT</th>
                <td><Target value={m.tpot_ms.p50} target={m.policy?.tpot_ms} /></td>
                <td><Target value={m.tpot_ms.p90} target={m.policy?.tpot_ms} /></td>
                <td><Target value={m.tpot_ms.p99} target={m.policy?.tpot_ms} /></td>
                <td>{m.policy ? `${m.policy.tpot_ms} ms` : "–"}</td>
              </tr>
            </tbody>
          </table>
        </div>
      ))}
      <FlowLevels hours={hours} />
    </Page>
  );
}

// --- requests -----------------------------------------------------------------------------------

export function Requests() {
  const [offset, setOffset] = useState(0);
  const limit = 25;
  const reqs = useApi<{ data: RequestRow[]; count: number }>(`/tenant/requests?limit=${limit}&offset=${offset}`, [offset], 10000);
  return (
    <Page title="Requests" intro="Recent requests with their timings. Open one to see its trace waterfall.">
      <Loaded q={reqs} what="requests" empty="No requests yet." isEmpty={(d) => d.count === 0}>
        {(page) => (
          <div className="card">
            <Table caption="Recent requests" cols={["Started", "Model", "Status", "Queued", "Tokens in / out", "TTFT", "TPOT", "Total", "Recovery"]}>
              {page.data.map((r) => (
                <tr key={r.id}>
                  <th scope="row">
                    <Link to={`/requests/${r.id}`} aria-label={`Request ${r.id.slice(0, 8)} at ${fmtTime(r.started_at)}`}>
                      {fmtTime(r.started_at)}
                    </Link>
                  </th>
                  <td>{r.model}</td>
                  <td>
                    <Badge tone={stateTone(r.status)}>{r.status}</Badge> <span className="muted">{r.http_status}</span>
                  </td>
                  <td>
                    {fmtMs(r.queue_ms)}
                    {r.flow_class && <span className="muted small"> {r.flow_class}</span>}
                  </td>
                  <td>
                    {fmtInt(r.prompt_tokens)} / {fmtInt(r.completion_tokens)}
                  </td>
                  <td>{fmtMs(r.ttft_ms)}</td>
                  <td>{fmtMs(r.tpot_ms)}</td>
                  <td>{fmtMs(r.e2e_ms)}</td>
                  <td>{r.recovery_steps ? <Badge tone="warn">{r.recovery_steps} steps</Badge> : "–"}</td>
                </tr>
              ))}
            </Table>
            <Pager label="Pages of requests" offset={offset} limit={limit} count={page.count} onChange={setOffset} />
          </div>
        )}
      </Loaded>
    </Page>
  );
}

export function RequestPage({ id }: { id: string }) {
  const r = useApi<RequestDetail>(`/tenant/requests/${encodeURIComponent(id)}`, [id]);
  return (
    <Page title="Request" intro={<Link to="/requests">← All requests</Link>}>
      <ErrorMessage error={r.error} />
      {r.loading && !r.data && <Loading what="the request" />}
      {r.data && (
        <>
          <div className="stats">
            <Stat label="Status" value={<Badge tone={stateTone(r.data.status)}>{r.data.status}</Badge>} hint={`HTTP ${r.data.http_status}${r.data.error_code ? `, ${r.data.error_code}` : ""}`} />
            <Stat label="TTFT" value={fmtMs(r.data.ttft_ms)} />
            <Stat label="TPOT" value={fmtMs(r.data.tpot_ms)} hint={`ITL p50 ${fmtMs(r.data.itl_p50_ms)}, p99 ${fmtMs(r.data.itl_p99_ms)}`} />
            <Stat label="Queue wait" value={fmtMs(r.data.queue_ms)} hint={r.data.flow_class ? `SLO class ${r.data.flow_class}` : "not queued"} />
            <Stat label="KV handoff" value={fmtMs(r.data.handoff_ms)} hint={fmtBytes(r.data.kv_bytes)} />
            <Stat label="Total" value={fmtMs(r.data.e2e_ms)} />
          </div>
          <div className="card">
            <Waterfall spans={r.data.waterfall} total={r.data.e2e_ms} />
          </div>
          <div className="card">
            <h2>Details</h2>
            <dl className="details">
              <dt>Request id</dt>
              <dd><code>{r.data.id}</code></dd>
              <dt>Trace id</dt>
              <dd>{r.data.trace_id ? <code>{r.data.trace_id}</code> : "–"}</dd>
              <dt>Model</dt>
              <dd>{r.data.model}{r.data.deployment ? ` (deployment ${r.data.deployment})` : ""}</dd>
              <dt>Tokens</dt>
              <dd>{fmtInt(r.data.prompt_tokens)} in, {fmtInt(r.data.completion_tokens)} out{r.data.stream ? ", streamed" : ""}</dd>
              <dt>Started</dt>
              <dd>{fmtTime(r.data.started_at)}</dd>
              <dt>Flow control</dt>
              <dd>
                {r.data.flow_class ? `SLO class ${r.data.flow_class}, waited ${fmtMs(r.data.queue_ms)} in the queue` : "not queued (flow control off)"}
                {r.data.error_code === "model_overloaded" ? "; refused: the model was overloaded" : ""}
              </dd>
              <dt>Recovery steps</dt>
              <dd>{r.data.recovery.length ? <pre>{JSON.stringify(r.data.recovery, null, 2)}</pre> : "none"}</dd>
            </dl>
          </div>
        </>
      )}
    </Page>
  );
}

// --- batches ------------------------------------------------------------------------------------

const BATCH_PAGE = 20;
/** Batches whose requests still wait to run: these a person may cancel. */
const CANCELLABLE = ["validating", "in_progress"];

/** A link that downloads one of a batch's files (a plain GET of the console's API, with the session's cookie). */
function FileLink({ id, label, batch }: { id: string | null; label: string; batch: string }) {
  if (!id) return null;
  return (
    <a href={`/console/api/tenant/files/${encodeURIComponent(id)}/content`} download>
      {label} <span className="sr-only">file of {batch}</span>
    </a>
  );
}

export function Batches({ canManage }: { canManage: boolean }) {
  // the `after` cursor of each older page opened (none: the newest page)
  const [cursors, setCursors] = useState<string[]>([]);
  const after = cursors[cursors.length - 1];
  const q = useApi<BatchList>(`/tenant/batches?limit=${BATCH_PAGE}${after ? `&after=${encodeURIComponent(after)}` : ""}`, [after], 10000);
  const act = useAction(() => q.reload());
  const cancel = (b: Batch) =>
    act.confirmed(`Cancel the batch ${b.id}? Its requests that have not started are not run; those running finish and are kept.`, () =>
      api(`/tenant/batches/${encodeURIComponent(b.id)}/cancel`, { method: "POST" }),
    );
  return (
    <Page
      title="Batches"
      intro={<>Requests sent together with the Batch API (<code>/v1/files</code>, <code>/v1/batches</code>), run within 24 hours beside your interactive traffic, never ahead of it.</>}
    >
      {!canManage && <p className="muted" data-testid="member-note">An admin of your organisation can cancel a batch.</p>}
      <ErrorMessage error={act.error} />
      <Loaded
        q={q}
        what="batches"
        isEmpty={(d) => d.data.length === 0 && cursors.length === 0}
        empty={<>No batches yet. Upload a file of requests (one JSON object a line) to <code>/v1/files</code> with purpose <code>batch</code>, then create a batch of it at <code>/v1/batches</code>.</>}
      >
        {(page) => (
          <div className="card">
            <Table caption="Your organisation's batches, newest first" cols={["Batch", "Endpoint", "Model", "Status", "Progress", "Created", "Files"]} actions={canManage ? "Actions" : undefined}>
              {page.data.map((b) => (
                <tr key={b.id}>
                  <th scope="row">
                    <code>{b.id}</code>
                  </th>
                  <td>
                    <code>{b.endpoint}</code>
                  </td>
                  <td>{b.model}</td>
                  <td>
                    <Badge tone={stateTone(b.status)}>{b.status.replace(/_/g, " ")}</Badge>
                    {b.errors?.data[0]?.message && <div className="muted small">{b.errors.data[0].message}</div>}
                  </td>
                  <td>
                    <Progress done={b.request_counts.completed} failed={b.request_counts.failed} total={b.request_counts.total} label={`Requests of ${b.id} ended`} />
                  </td>
                  <td>{fmtEpoch(b.created_at)}</td>
                  <td>
                    <span className="row">
                      <FileLink id={b.input_file_id} label="Input" batch={b.id} />
                      <FileLink id={b.output_file_id} label="Output" batch={b.id} />
                      <FileLink id={b.error_file_id} label="Errors" batch={b.id} />
                    </span>
                  </td>
                  {canManage && (
                    <td className="actions">
                      {CANCELLABLE.includes(b.status) && <RowButton label="Cancel" target={b.id} className="danger" disabled={act.busy} onClick={() => cancel(b)} />}
                    </td>
                  )}
                </tr>
              ))}
            </Table>
            {(cursors.length > 0 || page.has_more) && (
              <nav className="pager" aria-label="Pages of batches">
                <button type="button" className="secondary" disabled={cursors.length === 0} onClick={() => setCursors((c) => c.slice(0, -1))}>
                  Newer
                </button>
                <button type="button" className="secondary" disabled={!page.has_more || !page.last_id} onClick={() => page.last_id && setCursors((c) => [...c, page.last_id as string])}>
                  Older
                </button>
              </nav>
            )}
          </div>
        )}
      </Loaded>
    </Page>
  );
}

// --- playground ---------------------------------------------------------------------------------

export function Playground() {
  const models = useApi<TenantModel[]>("/tenant/models");
  const [model, setModel] = useState("");
  const [key, setKey] = useState("");
  const [system, setSystem] = useState("You are a helpful assistant.");
  const [prompt, setPrompt] = useState("");
  const [maxTokens, setMaxTokens] = useState(64);
  const [output, setOutput] = useState("");
  const [status, setStatus] = useState("");
  const [error, setError] = useState<string | Error | null>(null);
  const [busy, setBusy] = useState(false);
  const abort = useRef<AbortController | null>(null);
  const pgKey = useRef<{ model: string; secret: string; expires: number } | null>(null);
  useEffect(() => {
    if (!model && models.data?.length) setModel(models.data[0].name);
  }, [models.data, model]);

  const run = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    setOutput("");
    setStatus("Starting…");
    const ctrl = new AbortController();
    abort.current = ctrl;
    try {
      let secret = key.trim();
      if (!secret) {
        // One short-lived key per user: reused while it lasts (asking again revokes the previous one).
        const held = pgKey.current;
        if (held && held.model === model && held.expires - Date.now() > 60_000) secret = held.secret;
        else {
          const k = await api<IssuedKey>("/tenant/playground-key", { method: "POST", body: { model } });
          pgKey.current = { model, secret: k.secret, expires: k.key.expires_at ? Date.parse(k.key.expires_at) : Infinity };
          secret = k.secret;
        }
      }
      let usage = "";
      const messages = [...(system.trim() ? [{ role: "system", content: system }] : []), { role: "user", content: prompt }];
      const r = await streamChat(
        secret,
        { model, messages, max_tokens: maxTokens },
        {
          onDelta: (t) => setOutput((o) => o + t),
          onUsage: (u) => (usage = `${u.prompt_tokens} prompt + ${u.completion_tokens} completion tokens`),
        },
        ctrl.signal,
      );
      setStatus(
        `Done${r.finishReason ? ` (${r.finishReason})` : ""}: first token after ${fmtMs(r.ttftMs)}, ${fmtMs(r.totalMs)} in all${usage ? `, ${usage}` : ""}.`,
      );
    } catch (err) {
      if ((err as Error).name === "AbortError") setStatus("Stopped.");
      else {
        setStatus("");
        setError(err instanceof StreamError || err instanceof ApiError ? err : String(err));
      }
    } finally {
      setBusy(false);
      abort.current = null;
    }
  };

  return (
    <Page title="Playground" intro="Send a chat completion through the gateway and watch it stream.">
      <form className="card form" onSubmit={run}>
        <div className="grid-3">
          <div>
            <label htmlFor="pg-model">Model</label>
            <select id="pg-model" value={model} onChange={(e) => setModel(e.target.value)} required>
              {(models.data ?? []).map((m) => (
                <option key={m.id} value={m.name}>
                  {m.name}
                </option>
              ))}
            </select>
          </div>
          <div>
            <label htmlFor="pg-key">API key (optional)</label>
            <input id="pg-key" type="password" autoComplete="off" value={key} onChange={(e) => setKey(e.target.value)} aria-describedby="pg-key-hint" />
            <p id="pg-key-hint" className="hint">
              Leave empty to use a key for this model that expires in 15 minutes.
            </p>
          </div>
          <div>
            <label htmlFor="pg-max">Max tokens</label>
            <input id="pg-max" type="number" min={1} max={4096} value={maxTokens} onChange={(e) => setMaxTokens(Number(e.target.value))} />
          </div>
        </div>
        <label htmlFor="pg-system">System message</label>
        <input id="pg-system" value={system} onChange={(e) => setSystem(e.target.value)} />
        <label htmlFor="pg-prompt">Your message</label>
        <textarea id="pg-prompt" rows={4} required value={prompt} onChange={(e) => setPrompt(e.target.value)} />
        {models.data && models.data.length === 0 && <ErrorMessage error="No models are granted to your organisation yet." title="Nothing to try" />}
        <div className="row">
          <button type="submit" disabled={busy || !model}>
            {busy ? "Streaming…" : "Send"}
          </button>
          {busy && (
            <button type="button" className="secondary" onClick={() => abort.current?.abort()}>
              Stop
            </button>
          )}
        </div>
      </form>
      <ErrorMessage error={error} title="The request failed" />
      <div className="card">
        <h2>Response</h2>
        <div className="output" aria-live="polite" aria-busy={busy} data-testid="playground-output">
          {output || <span className="muted">The model's answer appears here.</span>}
        </div>
        <p className="muted" role="status" data-testid="playground-status">
          {status}
        </p>
      </div>
    </Page>
  );
}
