import { useEffect, useState, type FormEvent } from "react";
import { ApiError, api, type AccessRequest } from "./api";
import { Badge, Empty, ErrorMessage, Loading, Page, SecretOnce, Stat, TableHead, fmtBytes, fmtInt, fmtMs, fmtTime, stateTone, useAction, useApi } from "./components";

interface Tenant {
  id: string;
  name: string;
  display_name: string;
  status: string;
  created_at: string;
  models: string[];
  users: number;
  pending_request_id: string | null;
}
interface Model {
  id: string;
  name: string;
  source: string;
  context_length: number;
  num_layers: number;
  num_kv_heads: number;
  head_dim: number;
  dtype: string;
  params_b: number | null;
  kind: string;
  tool_call_parser: string | null;
  reasoning_parser: string | null;
  chat_template: string | null;
}
interface Deployment {
  id: string;
  name: string;
  model: string | null;
  model_id: string;
  mode: "aggregated" | "pd";
  prefill: { min: number; max: number };
  decode: { min: number; max: number };
  kv_connector: string | null;
  slo_policy_id: string | null;
  desired_state: string;
  observed_state: string;
  observed_reason: string | null;
  observed_at: string | null;
  generation: number;
  observed_generation: number;
}
interface Policy {
  id: string;
  name: string;
  ttft_ms: number;
  tpot_ms: number;
  percentile: number;
  priority: number;
  sheddable: boolean;
  weight: number;
  max_wait_s: number | null;
  max_waiting: number | null;
}
interface Assignment {
  id: string;
  policy_id: string;
  tenant_id: string | null;
  model_id: string | null;
}


// --- overview -----------------------------------------------------------------------------------

export function OpsOverview() {
  const ov = useApi<{ tenants: number; deployments: Record<string, number>; requests_last_hour: number; failed_last_hour: number }>(
    "/ops/overview",
    [],
    5000,
  );
  const deps = useApi<Deployment[]>("/ops/deployments", [], 5000);
  return (
    <Page title="Platform health" intro="Tenants, deployments and traffic across the platform.">
      <ErrorMessage error={ov.error} />
      {ov.data && (
        <div className="stats">
          <Stat label="Tenants" value={fmtInt(ov.data.tenants)} />
          <Stat label="Deployments running" value={fmtInt(ov.data.deployments.running ?? 0)} hint={`${fmtInt(Object.values(ov.data.deployments).reduce((a, b) => a + b, 0))} in all`} />
          <Stat label="Requests, last hour" value={fmtInt(ov.data.requests_last_hour)} />
          <Stat label="Failed, last hour" value={fmtInt(ov.data.failed_last_hour)} />
        </div>
      )}
      <div className="card">
        <h2>Deployments</h2>
        {deps.data && deps.data.length === 0 && <Empty>No deployments yet.</Empty>}
        <ul className="health">
          {deps.data?.map((d) => (
            <li key={d.id}>
              <Badge tone={stateTone(d.observed_state)}>{d.observed_state}</Badge> <strong>{d.name}</strong>{" "}
              <span className="muted">
                {d.model} · {d.mode === "pd" ? `P/D ${d.prefill.max}:${d.decode.max}` : "aggregated"}
              </span>
              {d.observed_reason && <span className="muted"> — {d.observed_reason}</span>}
            </li>
          ))}
        </ul>
      </div>
    </Page>
  );
}

// --- tenants ------------------------------------------------------------------------------------

function requester(who: string) {
  return who.startsWith("console:") ? who.slice("console:".length) : who;
}

function AccessRequests({ models, rev, onAnswered }: { models: Model[]; rev: number; onAnswered: () => void }) {
  // `rev` changes when the page changed grants elsewhere (a grant answers the requests it satisfies)
  const queue = useApi<{ data: AccessRequest[]; count: number }>("/ops/access-requests?state=pending", [rev]);
  const act = useAction(() => {
    queue.reload();
    onAnswered();
  });
  const [chosen, setChosen] = useState<Record<string, string>>({});
  const approve = (r: AccessRequest) => {
    const model_id = r.model_id ?? chosen[r.id];
    act.run(() => api(`/ops/access-requests/${r.id}/approve`, { method: "POST", body: r.model_id ? {} : { model_id } }));
  };
  const decline = (r: AccessRequest) => {
    const who = `“${r.tenant_display_name}” (${r.tenant_name})`;
    const reason = window.prompt(`Decline ${who}'s request for ${r.model ?? "a model"}? The organisation sees your reason (optional):`, "");
    if (reason === null) return;
    act.run(() => api(`/ops/access-requests/${r.id}/decline`, { method: "POST", body: { reason: reason.trim() || null } }));
  };
  const pending = queue.data?.data ?? [];
  return (
    <div className="card" data-testid="access-requests">
      <h2 id="requests-title">Access requests {queue.data ? <Badge tone={pending.length ? "warn" : "muted"}>{fmtInt(queue.data.count)} waiting</Badge> : null}</h2>
      <ErrorMessage error={queue.error ?? act.error} />
      {queue.data && pending.length === 0 && <p className="muted">No organisation is waiting for a model.</p>}
      {pending.length > 0 && (
        <table className="table" aria-labelledby="requests-title">
          <TableHead cols={["Organisation", "Asks for", "Asked"]} actions="Actions" />
          <tbody>
            {pending.map((r) => (
              <tr key={r.id}>
                <th scope="row">
                  {r.tenant_display_name} <span className="muted">({r.tenant_name})</span>
                  {r.note && <div className="muted">“{r.note}”</div>}
                </th>
                <td>
                  {r.model ? (
                    <code>{r.model}</code>
                  ) : (
                    <>
                      <label htmlFor={`approve-${r.id}`}>Any model: grant</label>
                      <select id={`approve-${r.id}`} value={chosen[r.id] ?? ""} onChange={(e) => setChosen({ ...chosen, [r.id]: e.target.value })}>
                        <option value="">Choose a model</option>
                        {models.map((m) => (
                          <option key={m.id} value={m.id}>
                            {m.name}
                          </option>
                        ))}
                      </select>
                    </>
                  )}
                </td>
                <td>
                  {fmtTime(r.requested_at)} <span className="muted">by {requester(r.requested_by)}</span>
                </td>
                <td className="actions">
                  <button type="button" disabled={act.busy || (!r.model_id && !chosen[r.id])} onClick={() => approve(r)}>
                    Approve <span className="sr-only">{r.tenant_name}</span>
                  </button>
                  <button type="button" className="danger" disabled={act.busy} onClick={() => decline(r)}>
                    Decline <span className="sr-only">{r.tenant_name}</span>
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  );
}

interface RateLimit {
  id: string;
  api_key_id: string | null;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  max_concurrency: number | null;
  max_tokens_per_request: number | null;
}

function RateLimits({ tenants }: { tenants: Tenant[] }) {
  const [tenantId, setTenantId] = useState("");
  const limits = useApi<RateLimit[]>(tenantId ? `/ops/tenants/${tenantId}/rate-limits` : null, [tenantId]);
  const act = useAction(() => limits.reload());
  const current = limits.data?.find((l) => l.api_key_id === null) ?? null;
  const perKey = (limits.data ?? []).filter((l) => l.api_key_id !== null).length;
  const [form, setForm] = useState({ requests_per_minute: "", tokens_per_minute: "", max_concurrency: "", max_tokens_per_request: "" });
  useEffect(() => {
    const v = (n: number | null | undefined) => (n === null || n === undefined ? "" : String(n));
    setForm({ requests_per_minute: v(current?.requests_per_minute), tokens_per_minute: v(current?.tokens_per_minute), max_concurrency: v(current?.max_concurrency), max_tokens_per_request: v(current?.max_tokens_per_request) });
  }, [current?.id, current?.requests_per_minute, current?.tokens_per_minute, current?.max_concurrency, current?.max_tokens_per_request]);
  const set = (e: FormEvent) => {
    e.preventDefault();
    const n = (x: string) => (x.trim() === "" ? null : Number(x));
    act.run(() =>
      api(`/ops/tenants/${tenantId}/rate-limit`, {
        method: "PUT",
        body: { requests_per_minute: n(form.requests_per_minute), tokens_per_minute: n(form.tokens_per_minute), max_concurrency: n(form.max_concurrency), max_tokens_per_request: n(form.max_tokens_per_request) },
      }),
    );
  };
  const tenant = tenants.find((t) => t.id === tenantId);
  const remove = () => {
    if (current && tenant)
      act.confirmed(`Remove every tenant-wide limit of “${tenant.display_name}” (${tenant.name})? Its keys are then limited only by their own limits.`, () =>
        api(`/ops/tenants/${tenantId}/rate-limits/${current.id}`, { method: "DELETE" }),
      );
  };
  const field = (k: keyof typeof form, label: string) => (
    <div>
      <label htmlFor={`limit-${k}`}>{label}</label>
      <input id={`limit-${k}`} type="number" min={1} step={1} placeholder="no limit" value={form[k]} disabled={!tenantId} onChange={(e) => setForm({ ...form, [k]: e.target.value })} />
    </div>
  );
  return (
    <form className="card form" onSubmit={set} aria-labelledby="limits-title" data-testid="rate-limits">
      <h2 id="limits-title">Rate limits</h2>
      <label htmlFor="limit-tenant">Organisation</label>
      <select id="limit-tenant" value={tenantId} onChange={(e) => setTenantId(e.target.value)}>
        <option value="">Choose a tenant</option>
        {tenants.map((t) => (
          <option key={t.id} value={t.id}>
            {t.name}
          </option>
        ))}
      </select>
      <div className="grid-3">
        {field("requests_per_minute", "Requests per minute")}
        {field("tokens_per_minute", "Tokens per minute")}
        {field("max_concurrency", "Requests at once")}
        {field("max_tokens_per_request", "Tokens per request")}
      </div>
      <p className="hint" data-testid="limits-now">
        {!tenantId
          ? "Limits apply to the whole organisation, on top of any limit of a key. Empty: no limit of that kind."
          : current
            ? `Now: ${current.requests_per_minute ?? "no limit on"} requests/min, ${current.tokens_per_minute ?? "no limit on"} tokens/min, ${current.max_concurrency ?? "no limit on"} at once, ${current.max_tokens_per_request ?? "no cap on"} tokens per request${perKey ? `; ${perKey} key(s) have limits of their own` : ""}.`
            : `Now: no tenant-wide limit${perKey ? `; ${perKey} key(s) have limits of their own` : ""}.`}
      </p>
      <div className="row">
        <button type="submit" disabled={act.busy || !tenantId}>
          Set limits
        </button>
        {current && (
          <button type="button" className="danger" disabled={act.busy} onClick={remove}>
            Remove limits
          </button>
        )}
      </div>
      <ErrorMessage error={act.error ?? limits.error} />
    </form>
  );
}

export function Tenants() {
  const tenants = useApi<Tenant[]>("/ops/tenants");
  const models = useApi<Model[]>("/ops/models");
  const [rev, setRev] = useState(0);
  const act = useAction(() => {
    tenants.reload();
    setRev((r) => r + 1);
  });
  const [tenantId, setTenantId] = useState("");
  const [modelId, setModelId] = useState("");
  const grant = (e: FormEvent) => {
    e.preventDefault();
    act.run(() => api(`/ops/tenants/${tenantId}/models/${modelId}`, { method: "PUT" }));
  };
  return (
    <Page title="Tenants" intro="Organisations on the platform, the models they may use, and their status.">
      <AccessRequests models={models.data ?? []} rev={rev} onAnswered={() => tenants.reload()} />
      <form className="card form" onSubmit={grant} aria-labelledby="grant-title">
        <h2 id="grant-title">Grant a model</h2>
        <div className="grid-3">
          <div>
            <label htmlFor="grant-tenant">Tenant</label>
            <select id="grant-tenant" required value={tenantId} onChange={(e) => setTenantId(e.target.value)}>
              <option value="">Choose a tenant</option>
              {tenants.data?.map((t) => (
                <option key={t.id} value={t.id}>
                  {t.name}
                </option>
              ))}
            </select>
          </div>
          <div>
            <label htmlFor="grant-model">Model</label>
            <select id="grant-model" required value={modelId} onChange={(e) => setModelId(e.target.value)}>
              <option value="">Choose a model</option>
              {models.data?.map((m) => (
                <option key={m.id} value={m.id}>
                  {m.name}
                </option>
              ))}
            </select>
          </div>
          <div className="align-end">
            <button type="submit" disabled={act.busy}>
              Grant
            </button>
          </div>
        </div>
        <ErrorMessage error={act.error} />
      </form>
      <RateLimits tenants={tenants.data ?? []} />
      <ErrorMessage error={tenants.error} />
      {tenants.loading && !tenants.data && <Loading what="tenants" />}
      {tenants.data && (
        <div className="card">
          <table className="table">
            <caption className="sr-only">Tenants</caption>
            <TableHead cols={["Tenant", "Status", "Models", "Users", "Created"]} actions="Actions" />
            <tbody>
              {tenants.data.map((t) => (
                <tr key={t.id}>
                  <th scope="row">
                    {t.display_name} <span className="muted">({t.name})</span>
                  </th>
                  <td>
                    <Badge tone={stateTone(t.status)}>{t.status}</Badge>
                  </td>
                  <td>
                    {t.models.length === 0 && <Badge tone="warn">waiting for access</Badge>}
                    <ul className="plain">
                      {t.models.map((name) => {
                        const model = models.data?.find((m) => m.name === name);
                        return (
                          <li key={name}>
                            {name}{" "}
                            {model && (
                              <button type="button" className="link danger" disabled={act.busy}
                                onClick={() => act.confirmed(`Revoke “${t.display_name}” (${t.name})'s access to ${name}? Its keys stop reaching the model at once.`, () => api(`/ops/tenants/${t.id}/models/${model.id}`, { method: "DELETE" }))}>
                                Revoke <span className="sr-only">{`${name} from ${t.name}`}</span>
                              </button>
                            )}
                          </li>
                        );
                      })}
                    </ul>
                  </td>
                  <td>{fmtInt(t.users)}</td>
                  <td>{fmtTime(t.created_at)}</td>
                  <td className="actions">
                    {t.status === "active" ? (
                      <button type="button" className="danger" onClick={() => act.confirmed(`Suspend “${t.display_name}” (${t.name})? Its API keys stop working at once and its users are signed out.`, () => api(`/ops/tenants/${t.id}/suspend`, { method: "POST" }))}>
                        Suspend <span className="sr-only">{t.name}</span>
                      </button>
                    ) : (
                      <button type="button" className="secondary" onClick={() => act.run(() => api(`/ops/tenants/${t.id}/resume`, { method: "POST" }))}>
                        Resume <span className="sr-only">{t.name}</span>
                      </button>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </Page>
  );
}

// --- models -------------------------------------------------------------------------------------

const DTYPES = ["float32", "float16", "bfloat16", "fp8", "int8"];

export function ModelsCatalogue() {
  const models = useApi<Model[]>("/ops/models");
  const act = useAction(() => models.reload());
  const blank = { name: "", source: "", context_length: 2048, num_layers: 2, num_kv_heads: 2, head_dim: 32, dtype: "float32", params_b: "",
    kind: "generate", tool_call_parser: "", reasoning_parser: "", chat_template: "" };
  const [form, setForm] = useState(blank);
  const create = async (e: FormEvent) => {
    e.preventDefault();
    const body = { ...form, params_b: form.params_b === "" ? null : Number(form.params_b),
      tool_call_parser: form.tool_call_parser || null, reasoning_parser: form.reasoning_parser || null,
      chat_template: form.chat_template || null };
    if (await act.run(() => api("/ops/models", { method: "POST", body }))) setForm(blank);
  };
  const num = (k: "context_length" | "num_layers" | "num_kv_heads" | "head_dim", label: string) => (
    <div>
      <label htmlFor={`model-${k}`}>{label}</label>
      <input id={`model-${k}`} type="number" min={1} required value={form[k]} onChange={(e) => setForm({ ...form, [k]: Number(e.target.value) })} />
    </div>
  );
  return (
    <Page title="Models" intro="The catalogue: each model's weights and the shape the planner and the KV-size formula use.">
      <form className="card form" onSubmit={create} aria-labelledby="model-title">
        <h2 id="model-title">Add a model</h2>
        <div className="grid-3">
          <div>
            <label htmlFor="model-name">Name</label>
            <input id="model-name" required maxLength={200} pattern="[A-Za-z0-9][A-Za-z0-9._:/\-]*" value={form.name} onChange={(e) => setForm({ ...form, name: e.target.value })} />
          </div>
          <div>
            <label htmlFor="model-source">Weights (folder on the workers)</label>
            <input id="model-source" required maxLength={4096} value={form.source} onChange={(e) => setForm({ ...form, source: e.target.value })} />
          </div>
          <div>
            <label htmlFor="model-dtype">Data type</label>
            <select id="model-dtype" value={form.dtype} onChange={(e) => setForm({ ...form, dtype: e.target.value })}>
              {DTYPES.map((d) => (
                <option key={d}>{d}</option>
              ))}
            </select>
          </div>
          {num("context_length", "Context (tokens)")}
          {num("num_layers", "Layers")}
          {num("num_kv_heads", "KV heads")}
          {num("head_dim", "Head dimension")}
          <div>
            <label htmlFor="model-params">Parameters (billions, optional)</label>
            <input id="model-params" type="number" min={0} step="any" value={form.params_b} onChange={(e) => setForm({ ...form, params_b: e.target.value })} />
          </div>
          <div>
            <label htmlFor="model-kind">Serves</label>
            <select id="model-kind" value={form.kind} onChange={(e) => setForm({ ...form, kind: e.target.value })}>
              <option value="generate">chat and completions</option>
              <option value="embed">embeddings</option>
            </select>
          </div>
          {form.kind === "generate" && (
            <>
              <div>
                <label htmlFor="model-tools">Tool-call parser (optional, e.g. hermes)</label>
                <input id="model-tools" maxLength={64} pattern="[a-z0-9_]*" value={form.tool_call_parser} onChange={(e) => setForm({ ...form, tool_call_parser: e.target.value })} />
              </div>
              <div>
                <label htmlFor="model-reasoning">Reasoning parser (optional)</label>
                <input id="model-reasoning" maxLength={64} pattern="[a-z0-9_]*" value={form.reasoning_parser} onChange={(e) => setForm({ ...form, reasoning_parser: e.target.value })} />
              </div>
            </>
          )}
          <div className="span-all">
            <label htmlFor="model-template">Chat template (optional; Jinja, replaces the model's own)</label>
            <textarea id="model-template" rows={3} maxLength={65536} value={form.chat_template} onChange={(e) => setForm({ ...form, chat_template: e.target.value })} />
          </div>
          <div className="align-end">
            <button type="submit" disabled={act.busy}>
              Add model
            </button>
          </div>
        </div>
        <ErrorMessage error={act.error} />
      </form>
      <ErrorMessage error={models.error} />
      {models.loading && !models.data && <Loading what="models" />}
      {models.data && models.data.length === 0 && <Empty>No models yet.</Empty>}
      {models.data && models.data.length > 0 && (
        <div className="card">
          <table className="table">
            <caption className="sr-only">Models</caption>
            <TableHead cols={["Model", "Weights", "Context", "Shape", "Serves"]} actions="Actions" />
            <tbody>
              {models.data.map((m) => (
                <tr key={m.id}>
                  <th scope="row">
                    <code>{m.name}</code>
                  </th>
                  <td>
                    <code>{m.source}</code>
                  </td>
                  <td>{fmtInt(m.context_length)} tokens</td>
                  <td>
                    {m.num_layers} layers, {m.num_kv_heads} KV heads × {m.head_dim}, {m.dtype}
                    {m.params_b ? `, ${m.params_b} B params` : ""}
                  </td>
                  <td>
                    {m.kind === "embed" ? "embeddings" : "chat, completions"}
                    {m.tool_call_parser ? `; tools (${m.tool_call_parser})` : ""}
                    {m.reasoning_parser ? `; reasoning (${m.reasoning_parser})` : ""}
                    {m.chat_template ? "; own chat template" : ""}
                  </td>
                  <td className="actions">
                    <button type="button" className="danger" disabled={act.busy}
                      onClick={() => act.confirmed(`Delete the model “${m.name}”? Every tenant loses access to it; a model that deployments still use cannot be deleted.`, () => api(`/ops/models/${m.id}`, { method: "DELETE" }))}>
                      Delete <span className="sr-only">{m.name}</span>
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </Page>
  );
}

// --- deployments --------------------------------------------------------------------------------

export function Deployments() {
  const deps = useApi<Deployment[]>("/ops/deployments", [], 2000);
  const models = useApi<Model[]>("/ops/models");
  const policies = useApi<{ policies: Policy[] }>("/ops/slo-policies");
  const act = useAction(() => deps.reload());
  const [name, setName] = useState("");
  const [modelId, setModelId] = useState("");
  const [mode, setMode] = useState<"aggregated" | "pd">("aggregated");
  const [prefill, setPrefill] = useState({ min: 1, max: 1 });
  const [decode, setDecode] = useState({ min: 1, max: 1 });
  const [policyId, setPolicyId] = useState("");
  useEffect(() => {
    if (!modelId && models.data?.length) setModelId(models.data[0].id);
  }, [models.data, modelId]);

  const create = async (e: FormEvent) => {
    e.preventDefault();
    const body: Record<string, unknown> = {
      name,
      model_id: modelId,
      mode,
      decode,
      prefill: mode === "pd" ? prefill : { min: 0, max: 0 },
      kv_connector: mode === "pd" ? "nixl" : null,
      slo_policy_id: policyId || null,
    };
    if (await act.run(() => api("/ops/deployments", { method: "POST", body }))) setName("");
  };
  const setDesired = (d: Deployment, desired: "running" | "stopped") =>
    act.run(() => api(`/ops/deployments/${d.id}`, { method: "PATCH", body: { desired_state: desired } }));
  const remove = (d: Deployment) => {
    act.confirmed(`Delete the deployment “${d.name}”? Its model stops being served.`, async () => {
      try {
        return await api(`/ops/deployments/${d.id}`, { method: "DELETE" });
      } catch (e) {
        // it served requests lately: the server wants force, the operator types the name to give it
        if (!(e instanceof ApiError) || e.status !== 409 || e.param !== "force") throw e;
        const typed = window.prompt(`${e.message}\n\nType the deployment's name (${d.name}) to delete it anyway.`);
        if (typed !== d.name) return false;
        return api(`/ops/deployments/${d.id}?force=true`, { method: "DELETE" });
      }
    });
  };
  const num = (v: string) => Math.max(0, Number(v) || 0);

  return (
    <Page title="Deployments" intro="What each model should run, and what Ray Serve reports (refreshed every 2 seconds).">
      <form className="card form" onSubmit={create} aria-labelledby="dep-create-title">
        <h2 id="dep-create-title">New deployment</h2>
        <div className="grid-3">
          <div>
            <label htmlFor="dep-name">Name</label>
            <input id="dep-name" required pattern="[a-z0-9][a-z0-9\-]{0,62}" value={name} onChange={(e) => setName(e.target.value)} aria-describedby="dep-name-hint" />
            <p id="dep-name-hint" className="hint">
              Lower-case letters, digits and “-”; also the route on Ray Serve.
            </p>
          </div>
          <div>
            <label htmlFor="dep-model">Model</label>
            <select id="dep-model" required value={modelId} onChange={(e) => setModelId(e.target.value)}>
              {models.data?.map((m) => (
                <option key={m.id} value={m.id}>
                  {m.name}
                </option>
              ))}
            </select>
          </div>
          <fieldset>
            <legend>Mode</legend>
            <label className="inline">
              <input type="radio" name="dep-mode" checked={mode === "aggregated"} onChange={() => setMode("aggregated")} /> Aggregated
            </label>
            <label className="inline">
              <input type="radio" name="dep-mode" checked={mode === "pd"} onChange={() => setMode("pd")} /> Prefill/decode split
            </label>
          </fieldset>
          {mode === "pd" && (
            <div>
              <span className="label">Prefill replicas</span>
              <div className="row">
                <label htmlFor="dep-pmin">min</label>
                <input id="dep-pmin" type="number" min={0} value={prefill.min} onChange={(e) => setPrefill({ ...prefill, min: num(e.target.value) })} />
                <label htmlFor="dep-pmax">max</label>
                <input id="dep-pmax" type="number" min={1} value={prefill.max} onChange={(e) => setPrefill({ ...prefill, max: num(e.target.value) })} />
              </div>
            </div>
          )}
          <div>
            <span className="label">{mode === "pd" ? "Decode replicas" : "Replicas"}</span>
            <div className="row">
              <label htmlFor="dep-dmin">min</label>
              <input id="dep-dmin" type="number" min={0} value={decode.min} onChange={(e) => setDecode({ ...decode, min: num(e.target.value) })} />
              <label htmlFor="dep-dmax">max</label>
              <input id="dep-dmax" type="number" min={1} value={decode.max} onChange={(e) => setDecode({ ...decode, max: num(e.target.value) })} />
            </div>
          </div>
          <div>
            <label htmlFor="dep-policy">SLO policy</label>
            <select id="dep-policy" value={policyId} onChange={(e) => setPolicyId(e.target.value)}>
              <option value="">none</option>
              {policies.data?.policies.map((p) => (
                <option key={p.id} value={p.id}>
                  {p.name}
                </option>
              ))}
            </select>
          </div>
        </div>
        <ErrorMessage error={act.error} />
        <button type="submit" disabled={act.busy || !modelId}>
          Create deployment
        </button>
      </form>
      <ErrorMessage error={deps.error} />
      {deps.loading && !deps.data && <Loading what="deployments" />}
      {deps.data && deps.data.length === 0 && <Empty>No deployments yet.</Empty>}
      {deps.data && deps.data.length > 0 && (
        <div className="card">
          <table className="table" aria-live="polite">
            <caption className="sr-only">Deployments</caption>
            <TableHead cols={["Name", "Model", "Mode and pools", "Desired", "Observed", "Generation"]} actions="Actions" />
            <tbody>
              {deps.data.map((d) => (
                <tr key={d.id} data-testid={`deployment-${d.name}`}>
                  <th scope="row">{d.name}</th>
                  <td>{d.model}</td>
                  <td>
                    {d.mode === "pd"
                      ? `P/D: prefill ${d.prefill.min}–${d.prefill.max}, decode ${d.decode.min}–${d.decode.max} (${d.kv_connector})`
                      : `aggregated: ${d.decode.min}–${d.decode.max} replicas`}
                  </td>
                  <td>{d.desired_state}</td>
                  <td>
                    <Badge tone={stateTone(d.observed_state)}>{d.observed_state}</Badge>
                    {d.observed_reason && <div className="muted small">{d.observed_reason}</div>}
                  </td>
                  <td>
                    {d.observed_generation}/{d.generation}
                  </td>
                  <td className="actions">
                    {d.desired_state === "running" && (
                      <button type="button" className="secondary" onClick={() => setDesired(d, "stopped")}>
                        Stop <span className="sr-only">{d.name}</span>
                      </button>
                    )}
                    {d.desired_state === "stopped" && (
                      <button type="button" className="secondary" onClick={() => setDesired(d, "running")}>
                        Start <span className="sr-only">{d.name}</span>
                      </button>
                    )}
                    {d.desired_state !== "deleted" && (
                      <button type="button" className="danger" onClick={() => remove(d)}>
                        Delete <span className="sr-only">{d.name}</span>
                      </button>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </Page>
  );
}

// --- SLO policies -------------------------------------------------------------------------------

export function SloPolicies() {
  const data = useApi<{ policies: Policy[]; assignments: Assignment[] }>("/ops/slo-policies");
  const tenants = useApi<Tenant[]>("/ops/tenants");
  const models = useApi<Model[]>("/ops/models");
  const act = useAction(() => data.reload());
  const [form, setForm] = useState({ name: "", ttft_ms: 500, tpot_ms: 50, percentile: 99, priority: 0, weight: 1, sheddable: false, max_wait_s: "", max_waiting: "" });
  const [asg, setAsg] = useState({ policy_id: "", tenant_id: "", model_id: "" });
  const [weight, setWeight] = useState<{ id: string; value: string } | null>(null);
  const create = (e: FormEvent) => {
    e.preventDefault();
    const body = { ...form, max_wait_s: form.max_wait_s === "" ? null : Number(form.max_wait_s), max_waiting: form.max_waiting === "" ? null : Number(form.max_waiting) };
    act.run(() => api("/ops/slo-policies", { method: "POST", body }));
  };
  const saveWeight = async (e: FormEvent) => {
    e.preventDefault();
    if (weight && (await act.run(() => api(`/ops/slo-policies/${weight.id}`, { method: "PATCH", body: { weight: Number(weight.value) } })))) setWeight(null);
  };
  const assign = (e: FormEvent) => {
    e.preventDefault();
    act.run(() =>
      api("/ops/slo-assignments", {
        method: "POST",
        body: { policy_id: asg.policy_id, tenant_id: asg.tenant_id || null, model_id: asg.model_id || null },
      }),
    );
  };
  const policyName = (id: string) => data.data?.policies.find((p) => p.id === id)?.name ?? id;
  const tenantName = (id: string | null) => (id ? tenants.data?.find((t) => t.id === id)?.name ?? id : "any tenant");
  const modelName = (id: string | null) => (id ? models.data?.find((m) => m.id === id)?.name ?? id : "any model");
  return (
    <Page title="SLO policies" intro="Latency targets, and to whom they apply. They drive admission and each pool's autoscaling.">
      <div className="two-col">
        <form className="card form" onSubmit={create} aria-labelledby="pol-title">
          <h2 id="pol-title">New policy</h2>
          <label htmlFor="pol-name">Name</label>
          <input id="pol-name" required maxLength={100} value={form.name} onChange={(e) => setForm({ ...form, name: e.target.value })} />
          <div className="row">
            <div>
              <label htmlFor="pol-ttft">TTFT target (ms)</label>
              <input id="pol-ttft" type="number" min={1} required value={form.ttft_ms} onChange={(e) => setForm({ ...form, ttft_ms: Number(e.target.value) })} />
            </div>
            <div>
              <label htmlFor="pol-tpot">TPOT target (ms)</label>
              <input id="pol-tpot" type="number" min={1} required value={form.tpot_ms} onChange={(e) => setForm({ ...form, tpot_ms: Number(e.target.value) })} />
            </div>
          </div>
          <div className="row">
            <div>
              <label htmlFor="pol-pct">Percentile</label>
              <input id="pol-pct" type="number" min={1} max={100} step="0.1" value={form.percentile} onChange={(e) => setForm({ ...form, percentile: Number(e.target.value) })} />
            </div>
            <div>
              <label htmlFor="pol-prio">Priority (0–100)</label>
              <input id="pol-prio" type="number" min={0} max={100} value={form.priority} onChange={(e) => setForm({ ...form, priority: Number(e.target.value) })} />
            </div>
            <div>
              <label htmlFor="pol-weight">Weight</label>
              <input id="pol-weight" type="number" min={0.01} max={100} step="any" required value={form.weight} aria-describedby="pol-weight-hint" onChange={(e) => setForm({ ...form, weight: Number(e.target.value) })} />
            </div>
          </div>
          <p id="pol-weight-hint" className="hint">Weight: share of the band's tokens relative to other tenants (1 = equal).</p>
          <div className="row">
            <div>
              <label htmlFor="pol-maxwait">Longest wait in the queue (s)</label>
              <input id="pol-maxwait" type="number" min={0.001} max={3600} step="any" placeholder="gateway's" aria-describedby="pol-queue-hint" value={form.max_wait_s} onChange={(e) => setForm({ ...form, max_wait_s: e.target.value })} />
            </div>
            <div>
              <label htmlFor="pol-maxwaiting">Waiting per tenant</label>
              <input id="pol-maxwaiting" type="number" min={1} max={100000} step={1} placeholder="no bound" aria-describedby="pol-queue-hint" value={form.max_waiting} onChange={(e) => setForm({ ...form, max_waiting: e.target.value })} />
            </div>
          </div>
          <p id="pol-queue-hint" className="hint">Under overload: how long a request may wait for room, and how many of one tenant's requests may wait at once (per gateway process); past either, 429 with Retry-After. Empty: the gateway's settings.</p>
          <label className="inline">
            <input type="checkbox" checked={form.sheddable} onChange={(e) => setForm({ ...form, sheddable: e.target.checked })} /> Sheddable under overload
          </label>
          <button type="submit" disabled={act.busy}>
            Create policy
          </button>
        </form>
        <form className="card form" onSubmit={assign} aria-labelledby="asg-title">
          <h2 id="asg-title">Assign a policy</h2>
          <label htmlFor="asg-policy">Policy</label>
          <select id="asg-policy" required value={asg.policy_id} onChange={(e) => setAsg({ ...asg, policy_id: e.target.value })}>
            <option value="">Choose a policy</option>
            {data.data?.policies.map((p) => (
              <option key={p.id} value={p.id}>
                {p.name}
              </option>
            ))}
          </select>
          <label htmlFor="asg-tenant">Tenant</label>
          <select id="asg-tenant" value={asg.tenant_id} onChange={(e) => setAsg({ ...asg, tenant_id: e.target.value })}>
            <option value="">any tenant</option>
            {tenants.data?.map((t) => (
              <option key={t.id} value={t.id}>
                {t.name}
              </option>
            ))}
          </select>
          <label htmlFor="asg-model">Model</label>
          <select id="asg-model" value={asg.model_id} onChange={(e) => setAsg({ ...asg, model_id: e.target.value })}>
            <option value="">any model</option>
            {models.data?.map((m) => (
              <option key={m.id} value={m.id}>
                {m.name}
              </option>
            ))}
          </select>
          <p className="hint">The most specific assignment wins: tenant and model, then tenant, then model.</p>
          <button type="submit" disabled={act.busy}>
            Assign
          </button>
        </form>
      </div>
      <ErrorMessage error={act.error} />
      <ErrorMessage error={data.error} />
      {data.data && (
        <div className="card">
          <h2>Policies</h2>
          {data.data.policies.length === 0 ? (
            <Empty>No policies yet.</Empty>
          ) : (
            <div className="table-scroll">
              <table className="table">
                <TableHead cols={["Name", "TTFT", "TPOT", "Percentile", "Priority", "Weight", "Queue", "Sheddable", "Applies to"]} actions="Actions" />
                <tbody>
                  {data.data.policies.map((p) => (
                    <tr key={p.id}>
                      <th scope="row">{p.name}</th>
                      <td>{p.ttft_ms} ms</td>
                      <td>{p.tpot_ms} ms</td>
                      <td>p{p.percentile}</td>
                      <td>{p.priority}</td>
                      <td>
                        {weight?.id === p.id ? (
                          <form className="row cell-form" onSubmit={saveWeight}>
                            <input type="number" min={0.01} max={100} step="any" required aria-label={`Weight of ${p.name}`} aria-describedby="pol-weight-hint"
                              value={weight.value} onChange={(e) => setWeight({ id: p.id, value: e.target.value })} />
                            <button type="submit" disabled={act.busy}>
                              Save <span className="sr-only">{`weight of ${p.name}`}</span>
                            </button>
                            <button type="button" className="secondary" onClick={() => setWeight(null)}>
                              Cancel
                            </button>
                          </form>
                        ) : (
                          <>
                            {p.weight}{" "}
                            <button type="button" className="link" disabled={act.busy} onClick={() => setWeight({ id: p.id, value: String(p.weight) })}>
                              Edit <span className="sr-only">{`weight of ${p.name}`}</span>
                            </button>
                          </>
                        )}
                      </td>
                      <td>
                        {p.max_wait_s === null ? "gateway's wait" : `waits ≤ ${p.max_wait_s} s`}
                        {p.max_waiting === null ? "" : `, ≤ ${p.max_waiting} waiting`}
                      </td>
                      <td>{p.sheddable ? "yes" : "no"}</td>
                      <td>
                        {data.data!.assignments.filter((a) => a.policy_id === p.id).length === 0 && <span className="muted">not assigned</span>}
                        <ul className="plain">
                          {data.data!.assignments
                            .filter((a) => a.policy_id === p.id)
                            .map((a) => (
                              <li key={a.id}>
                                {tenantName(a.tenant_id)} / {modelName(a.model_id)}{" "}
                                <button type="button" className="link danger" disabled={act.busy}
                                  onClick={() => act.confirmed(`Stop applying “${p.name}” to ${tenantName(a.tenant_id)} / ${modelName(a.model_id)}? A less specific assignment applies instead, if any.`, () => api(`/ops/slo-assignments/${a.id}`, { method: "DELETE" }))}>
                                  Unassign <span className="sr-only">{`${p.name} from ${tenantName(a.tenant_id)} / ${modelName(a.model_id)}`}</span>
                                </button>
                              </li>
                            ))}
                        </ul>
                      </td>
                      <td className="actions">
                        <button type="button" className="danger" disabled={act.busy}
                          onClick={() => act.confirmed(`Delete the policy “${p.name}”? Its assignments go with it; deployments that used it keep running without one.`, () => api(`/ops/slo-policies/${p.id}`, { method: "DELETE" }))}>
                          Delete <span className="sr-only">{p.name}</span>
                        </button>
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <span className="sr-only">{data.data.assignments.map((a) => policyName(a.policy_id)).join(", ")}</span>
        </div>
      )}
    </Page>
  );
}

// --- planner ------------------------------------------------------------------------------------

interface PlanConfig {
  name: string;
  prefill: number;
  decode: number;
  goodput_per_gpu: number;
  ttft_ms: number;
  tpot_ms: number;
  bottleneck: string;
  gpus: number;
  gpus_needed: number | null;
}
interface PlanResult {
  model: string;
  calibrated_from: number;
  kv_bytes_per_token: number;
  kv_bytes_per_request: number;
  transfer_lower_bound_ms: number;
  transfer_expected_ms: number;
  configs: PlanConfig[];
  recommended: string | null;
  reason: string;
  plot_png_base64: string;
  plot_narrow_png_base64?: string;
  feasible?: boolean;
  closest?: PlanConfig | null;
  to_meet?: { text: string; changes: Record<string, number>; then: { recommended?: string } }[];
  calibration?: { samples: number; used: boolean; reason: string };
}

/** Whether any configuration meets the SLO (older servers sent no ``feasible``: all-zero goodput is none). */
function planFeasible(plan: PlanResult): boolean {
  if (typeof plan.feasible === "boolean") return plan.feasible;
  return plan.configs.some((c) => c.goodput_per_gpu > 0);
}

export function Planner() {
  const models = useApi<Model[]>("/ops/models");
  const [modelId, setModelId] = useState("");
  const [form, setForm] = useState({ ttft_ms: 1000, tpot_ms: 50, percentile: 90, prompt_tokens_mean: 512, output_tokens_mean: 128 });
  const [plan, setPlan] = useState<PlanResult | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    if (!modelId && models.data?.length) setModelId(models.data[0].id);
  }, [models.data, modelId]);
  const run = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      setPlan(await api<PlanResult>(`/ops/models/${modelId}/plan`, { method: "POST", body: form }));
    } catch (err) {
      setError(err as ApiError);
    } finally {
      setBusy(false);
    }
  };
  const field = (id: keyof typeof form, label: string) => (
    <div>
      <label htmlFor={`plan-${id}`}>{label}</label>
      <input id={`plan-${id}`} type="number" min={id.endsWith("_ms") ? 0.1 : 1} step={id.endsWith("_ms") || id === "percentile" ? "any" : 1} required value={form[id]}
        onChange={(e) => setForm({ ...form, [id]: Number(e.target.value) })} />
    </div>
  );
  return (
    <Page title="P/D planner" intro="Should a model be disaggregated, and at which prefill:decode ratio? Goodput per GPU decides.">
      <form className="card form" onSubmit={run}>
        <div className="grid-3">
          <div>
            <label htmlFor="plan-model">Model</label>
            <select id="plan-model" value={modelId} onChange={(e) => setModelId(e.target.value)} required>
              {models.data?.map((m) => (
                <option key={m.id} value={m.id}>
                  {m.name}
                </option>
              ))}
            </select>
          </div>
          {field("ttft_ms", "TTFT SLO (ms)")}
          {field("tpot_ms", "TPOT SLO (ms)")}
          {field("percentile", "Percentile")}
          {field("prompt_tokens_mean", "Mean prompt tokens")}
          {field("output_tokens_mean", "Mean output tokens")}
        </div>
        <ErrorMessage error={error} title="The planner could not run" />
        <button type="submit" disabled={busy || !modelId}>
          {busy ? "Planning…" : "Plan"}
        </button>
      </form>
      {plan && (
        <>
          {planFeasible(plan) && plan.recommended ? (
            <div className="card recommendation" role="status">
              <h2>
                Recommendation: <span data-testid="plan-recommended">{plan.recommended}</span>
              </h2>
              <p>{plan.reason}</p>
            </div>
          ) : (
            <div className="card no-plan" role="status" data-testid="plan-infeasible">
              <h2>Nothing meets this SLO</h2>
              <p>{plan.reason}</p>
              {plan.closest && (
                <p>
                  Closest: <strong>{plan.closest.name}</strong>, p{form.percentile} TTFT {fmtMs(plan.closest.ttft_ms)} and TPOT{" "}
                  {fmtMs(plan.closest.tpot_ms)} with no other traffic.
                </p>
              )}
              {plan.to_meet && plan.to_meet.length > 0 && (
                <>
                  <p>What would meet it:</p>
                  <ul>
                    {plan.to_meet.map((r) => (
                      <li key={r.text}>
                        {r.text}
                        {r.then?.recommended ? ` (then: ${r.then.recommended})` : ""}
                      </li>
                    ))}
                  </ul>
                </>
              )}
            </div>
          )}
          <p className="muted">
            {plan.calibration
              ? `Throughput ${plan.calibration.used ? "calibrated" : "not calibrated"}: ${plan.calibration.reason}.`
              : plan.calibrated_from
                ? `Calibrated from ${plan.calibrated_from} measured requests.`
                : "From configured throughput (no measured requests yet)."}
          </p>
          <div className="stats">
            <Stat label="KV per token" value={fmtBytes(plan.kv_bytes_per_token)} />
            <Stat label="KV per request" value={fmtBytes(plan.kv_bytes_per_request)} />
            <Stat label="Transfer lower bound" value={fmtMs(plan.transfer_lower_bound_ms)} hint={`expected ${fmtMs(plan.transfer_expected_ms)}`} />
          </div>
          <div className="card">
            <picture>
              {plan.plot_narrow_png_base64 && <source media="(max-width: 700px)" srcSet={`data:image/png;base64,${plan.plot_narrow_png_base64}`} />}
              <img className="plot" src={`data:image/png;base64,${plan.plot_png_base64}`} alt={planFeasible(plan) ? `Planner plot: goodput per GPU by configuration; ${plan.recommended} recommended.` : `Planner plot: share of requests within the SLO by configuration; nothing meets it, ${plan.closest?.name ?? "none"} comes closest.`} />
            </picture>
          </div>
          <div className="card">
            <table className="table">
              <caption>Goodput per configuration</caption>
              <TableHead cols={["Configuration", "Goodput (req/s per GPU)", "TTFT", "TPOT", "Bottleneck", "GPUs per unit"]} />
              <tbody>
                {plan.configs.map((c) => (
                  <tr key={c.name} className={c.name === plan.recommended ? "highlight" : undefined}>
                    <th scope="row">{c.name}{c.name === plan.recommended ? " (recommended)" : ""}</th>
                    <td>{c.goodput_per_gpu.toFixed(3)}</td>
                    <td>{fmtMs(c.ttft_ms)}</td>
                    <td>{fmtMs(c.tpot_ms)}</td>
                    <td>{c.bottleneck}</td>
                    <td>{c.gpus}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </>
      )}
    </Page>
  );
}

// --- audit --------------------------------------------------------------------------------------

interface AuditRow {
  id: number;
  at: string;
  actor: string;
  action: string;
  target_type: string;
  target_id: string | null;
  target_name: string | null;
  tenant_id: string | null;
  tenant_name: string | null;
  before: unknown;
  after: unknown;
}

export function Audit() {
  const [offset, setOffset] = useState(0);
  const [type, setType] = useState("");
  const limit = 50;
  const log = useApi<{ data: AuditRow[]; count: number }>(
    `/ops/audit?limit=${limit}&offset=${offset}${type ? `&target_type=${encodeURIComponent(type)}` : ""}`,
    [offset, type],
  );
  return (
    <Page
      title="Audit log"
      intro="Every change to tenants, keys, models, deployments and policies, with who made it."
      actions={
        <div>
          <label htmlFor="audit-type">Show</label>{" "}
          <select id="audit-type" value={type} onChange={(e) => { setType(e.target.value); setOffset(0); }}>
            <option value="">everything</option>
            {["tenant", "user", "api_key", "access_request", "model", "tenant_model", "deployment", "slo_policy", "slo_assignment", "admin_token", "serve_config"].map((t) => (
              <option key={t} value={t}>
                {t.replace(/_/g, " ")}
              </option>
            ))}
          </select>
        </div>
      }
    >
      <ErrorMessage error={log.error} />
      {log.loading && !log.data && <Loading what="the audit log" />}
      {log.data && log.data.count === 0 && <Empty>Nothing recorded yet.</Empty>}
      {log.data && log.data.count > 0 && (
        <div className="card">
          <table className="table">
            <caption className="sr-only">Audit entries</caption>
            <TableHead cols={["When", "Who", "Action", "Target", "Change"]} />
            <tbody>
              {log.data.data.map((a) => (
                <tr key={a.id}>
                  <td>{fmtTime(a.at)}</td>
                  <td>{a.actor}</td>
                  <th scope="row">{a.action}</th>
                  <td>
                    <span className="muted">{a.target_type.replace(/_/g, " ")}</span>{" "}
                    {a.target_name ? <strong title={a.target_id ?? undefined}>{a.target_name}</strong>
                      : <code className="small" title={a.target_id ?? undefined}>{a.target_id?.slice(0, 8)}</code>}
                    {a.tenant_name && a.target_type !== "tenant" && <span className="muted"> · tenant {a.tenant_name}</span>}
                  </td>
                  <td>
                    {(a.before !== null || a.after !== null) && (
                      <details>
                        <summary>Show</summary>
                        <pre className="small">{JSON.stringify({ before: a.before, after: a.after }, null, 2)}</pre>
                      </details>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <nav className="pager" aria-label="Pages of the audit log">
            <button type="button" className="secondary" disabled={offset === 0} onClick={() => setOffset(Math.max(0, offset - limit))}>
              Newer
            </button>
            <span>
              {offset + 1}–{Math.min(offset + limit, log.data.count)} of {log.data.count}
            </span>
            <button type="button" className="secondary" disabled={offset + limit >= log.data.count} onClick={() => setOffset(offset + limit)}>
              Older
            </button>
          </nav>
        </div>
      )}
    </Page>
  );
}

// --- admin tokens -------------------------------------------------------------------------------

interface AdminToken {
  id: string;
  name: string;
  prefix: string;
  created_at: string;
  revoked_at: string | null;
}

export function AdminTokens() {
  const tokens = useApi<AdminToken[]>("/ops/admin-tokens");
  const act = useAction(() => tokens.reload());
  const [name, setName] = useState("");
  const [issued, setIssued] = useState<{ name: string; secret: string } | null>(null);
  const create = (e: FormEvent) => {
    e.preventDefault();
    act.run(async () => {
      const r = await api<{ token: AdminToken; secret: string }>("/ops/admin-tokens", { method: "POST", body: { name } });
      setIssued({ name: r.token.name, secret: r.secret });
      setName("");
    });
  };
  return (
    <Page title="Admin tokens" intro="Bearer tokens for the admin REST API (/admin/v1): for automation and scripts. Baton keeps only their hashes.">
      <ErrorMessage error={tokens.error ?? act.error} />
      {issued && (
        <SecretOnce id="token-secret" title={`Your new admin token “${issued.name}”`} label="Admin token" copyLabel="Copy token"
          secret={issued.secret} onDone={() => setIssued(null)}>
          Copy it now: Baton shows it <strong>only once</strong>. It can do everything an operator can.
        </SecretOnce>
      )}
      <form className="card form" onSubmit={create} aria-labelledby="token-title">
        <h2 id="token-title">New admin token</h2>
        <label htmlFor="token-name">Name</label>
        <input id="token-name" required maxLength={100} placeholder="e.g. deploy pipeline" value={name} onChange={(e) => setName(e.target.value)} />
        <button type="submit" disabled={act.busy}>
          Create token
        </button>
      </form>
      {tokens.loading && !tokens.data && <Loading what="the admin tokens" />}
      {tokens.data && tokens.data.length === 0 && <Empty>No admin tokens yet.</Empty>}
      {tokens.data && tokens.data.length > 0 && (
        <div className="card">
          <table className="table" aria-label="Admin tokens">
            <TableHead cols={["Name", "Token", "Created", "State"]} actions="Actions" />
            <tbody>
              {tokens.data.map((t) => (
                <tr key={t.id}>
                  <th scope="row">{t.name}</th>
                  <td>
                    <code>{t.prefix}…</code>
                  </td>
                  <td>{fmtTime(t.created_at)}</td>
                  <td>{t.revoked_at ? <Badge tone="bad">revoked {fmtTime(t.revoked_at)}</Badge> : <Badge tone="ok">active</Badge>}</td>
                  <td className="actions">
                    {!t.revoked_at && (
                      <button type="button" className="danger" disabled={act.busy}
                        onClick={() => act.confirmed(`Revoke the admin token “${t.name}”? Anything using it is refused at once.`, () => api(`/ops/admin-tokens/${t.id}`, { method: "DELETE" }))}>
                        Revoke <span className="sr-only">{t.name}</span>
                      </button>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </Page>
  );
}

// --- an organisation's users ----------------------------------------------------------------------

interface TenantUserRow {
  id: string;
  email: string;
  role: "tenant_admin" | "tenant_member";
  disabled: boolean;
  created_at: string;
  last_login_at: string | null;
}

const ROLE_NAMES: Record<TenantUserRow["role"], string> = { tenant_admin: "admin", tenant_member: "member" };

export function TenantUsers() {
  const tenants = useApi<Tenant[]>("/ops/tenants");
  const [tenantId, setTenantId] = useState("");
  const users = useApi<TenantUserRow[]>(tenantId ? `/ops/tenants/${tenantId}/users` : null, [tenantId]);
  const act = useAction(() => users.reload());
  const [form, setForm] = useState({ email: "", password: "", role: "tenant_member" });
  const tenant = tenants.data?.find((t) => t.id === tenantId);
  const base = `/ops/tenants/${tenantId}/users`;
  const add = (e: FormEvent) => {
    e.preventDefault();
    act.run(async () => {
      await api(base, { method: "POST", body: form });
      setForm({ email: "", password: "", role: "tenant_member" });
    });
  };
  return (
    <Page title="Users" intro="Who signs in to an organisation's console: add people, change their role, disable or remove them.">
      <ErrorMessage error={tenants.error ?? users.error ?? act.error} />
      <div className="card form">
        <label htmlFor="users-tenant">Organisation</label>
        <select id="users-tenant" value={tenantId} onChange={(e) => setTenantId(e.target.value)}>
          <option value="">Choose an organisation</option>
          {tenants.data?.map((t) => (
            <option key={t.id} value={t.id}>
              {t.name}
            </option>
          ))}
        </select>
      </div>
      {tenant && (
        <form className="card form" onSubmit={add} aria-labelledby="user-title">
          <h2 id="user-title">Add a user to {tenant.display_name}</h2>
          <label htmlFor="user-email">Email</label>
          <input id="user-email" type="email" required maxLength={320} value={form.email} onChange={(e) => setForm({ ...form, email: e.target.value })} />
          <label htmlFor="user-password">First password (at least 12 characters)</label>
          <input id="user-password" type="password" required minLength={12} maxLength={256} autoComplete="new-password" value={form.password} onChange={(e) => setForm({ ...form, password: e.target.value })} />
          <label htmlFor="user-role">Role</label>
          <select id="user-role" value={form.role} onChange={(e) => setForm({ ...form, role: e.target.value })}>
            <option value="tenant_member">member</option>
            <option value="tenant_admin">admin</option>
          </select>
          <button type="submit" disabled={act.busy}>
            Add user
          </button>
        </form>
      )}
      {tenant && users.loading && !users.data && <Loading what="the users" />}
      {tenant && users.data && (
        <div className="card">
          <table className="table" aria-label="Users">
            <TableHead cols={["Email", "Role", "State", "Last sign-in"]} actions="Actions" />
            <tbody>
              {users.data.map((u) => (
                <tr key={u.id}>
                  <th scope="row">{u.email}</th>
                  <td>{ROLE_NAMES[u.role]}</td>
                  <td>{u.disabled ? <Badge tone="bad">disabled</Badge> : <Badge tone="ok">active</Badge>}</td>
                  <td>{u.last_login_at ? fmtTime(u.last_login_at) : "never"}</td>
                  <td className="actions">
                    <button type="button" className="secondary" disabled={act.busy}
                      onClick={() => act.run(() => api(`${base}/${u.id}`, { method: "PATCH", body: { role: u.role === "tenant_admin" ? "tenant_member" : "tenant_admin" } }))}>
                      {u.role === "tenant_admin" ? "Make member" : "Make admin"} <span className="sr-only">{u.email}</span>
                    </button>{" "}
                    {u.disabled ? (
                      <button type="button" className="secondary" disabled={act.busy} onClick={() => act.run(() => api(`${base}/${u.id}`, { method: "PATCH", body: { disabled: false } }))}>
                        Enable <span className="sr-only">{u.email}</span>
                      </button>
                    ) : (
                      <button type="button" className="danger" disabled={act.busy}
                        onClick={() => act.confirmed(`Disable ${u.email}? They are signed out at once and cannot sign in until enabled.`, () => api(`${base}/${u.id}`, { method: "PATCH", body: { disabled: true } }))}>
                        Disable <span className="sr-only">{u.email}</span>
                      </button>
                    )}{" "}
                    <button type="button" className="danger" disabled={act.busy}
                      onClick={() => act.confirmed(`Remove ${u.email} from ${tenant.name}? This cannot be undone.`, () => api(`${base}/${u.id}`, { method: "DELETE" }))}>
                      Remove <span className="sr-only">{u.email}</span>
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </Page>
  );
}
