import { useEffect, useState, type FormEvent } from "react";
import { ApiError, api } from "./api";
import { Badge, Empty, ErrorMessage, Loading, Page, Stat, fmtBytes, fmtInt, fmtMs, fmtTime, stateTone, useApi } from "./components";

interface Tenant {
  id: string;
  name: string;
  display_name: string;
  status: string;
  created_at: string;
  models: string[];
  users: number;
}
interface Model {
  id: string;
  name: string;
  context_length: number;
  num_layers: number;
  num_kv_heads: number;
  head_dim: number;
  dtype: string;
  params_b: number | null;
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
}
interface Assignment {
  id: string;
  policy_id: string;
  tenant_id: string | null;
  model_id: string | null;
}

function useAction(after: () => void) {
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
  return { error, busy, run };
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

export function Tenants() {
  const tenants = useApi<Tenant[]>("/ops/tenants");
  const models = useApi<Model[]>("/ops/models");
  const act = useAction(() => tenants.reload());
  const [tenantId, setTenantId] = useState("");
  const [modelId, setModelId] = useState("");
  const grant = (e: FormEvent) => {
    e.preventDefault();
    act.run(() => api(`/ops/tenants/${tenantId}/models/${modelId}`, { method: "PUT" }));
  };
  return (
    <Page title="Tenants" intro="Organisations on the platform, the models they may use, and their status.">
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
      <ErrorMessage error={tenants.error} />
      {tenants.loading && !tenants.data && <Loading what="tenants" />}
      {tenants.data && (
        <div className="card">
          <table className="table">
            <caption className="sr-only">Tenants</caption>
            <thead>
              <tr>
                <th scope="col">Tenant</th>
                <th scope="col">Status</th>
                <th scope="col">Models</th>
                <th scope="col">Users</th>
                <th scope="col">Created</th>
                <th scope="col">
                  <span className="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {tenants.data.map((t) => (
                <tr key={t.id}>
                  <th scope="row">
                    {t.display_name} <span className="muted">({t.name})</span>
                  </th>
                  <td>
                    <Badge tone={stateTone(t.status)}>{t.status}</Badge>
                  </td>
                  <td>{t.models.length ? t.models.join(", ") : <span className="muted">none</span>}</td>
                  <td>{fmtInt(t.users)}</td>
                  <td>{fmtTime(t.created_at)}</td>
                  <td className="actions">
                    {t.status === "active" ? (
                      <button type="button" className="danger" onClick={() => act.run(() => api(`/ops/tenants/${t.id}/suspend`, { method: "POST" }))}>
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
    if (window.confirm(`Delete the deployment “${d.name}”? Its model stops being served.`))
      act.run(() => api(`/ops/deployments/${d.id}`, { method: "DELETE" }));
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
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Model</th>
                <th scope="col">Mode and pools</th>
                <th scope="col">Desired</th>
                <th scope="col">Observed</th>
                <th scope="col">Generation</th>
                <th scope="col">
                  <span className="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
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
  const [form, setForm] = useState({ name: "", ttft_ms: 500, tpot_ms: 50, percentile: 99, priority: 0, sheddable: false });
  const [asg, setAsg] = useState({ policy_id: "", tenant_id: "", model_id: "" });
  const create = (e: FormEvent) => {
    e.preventDefault();
    act.run(() => api("/ops/slo-policies", { method: "POST", body: form }));
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
          </div>
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
            <table className="table">
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">TTFT</th>
                  <th scope="col">TPOT</th>
                  <th scope="col">Percentile</th>
                  <th scope="col">Priority</th>
                  <th scope="col">Sheddable</th>
                  <th scope="col">Applies to</th>
                </tr>
              </thead>
              <tbody>
                {data.data.policies.map((p) => (
                  <tr key={p.id}>
                    <th scope="row">{p.name}</th>
                    <td>{p.ttft_ms} ms</td>
                    <td>{p.tpot_ms} ms</td>
                    <td>p{p.percentile}</td>
                    <td>{p.priority}</td>
                    <td>{p.sheddable ? "yes" : "no"}</td>
                    <td>
                      {data.data!.assignments.filter((a) => a.policy_id === p.id).map((a) => `${tenantName(a.tenant_id)} / ${modelName(a.model_id)}`).join("; ") || (
                        <span className="muted">not assigned</span>
                      )}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
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
  recommended: string;
  reason: string;
  plot_png_base64: string;
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
      <input id={`plan-${id}`} type="number" min={1} required value={form[id]} onChange={(e) => setForm({ ...form, [id]: Number(e.target.value) })} />
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
          <div className="card recommendation" role="status">
            <h2>
              Recommendation: <span data-testid="plan-recommended">{plan.recommended}</span>
            </h2>
            <p>{plan.reason}</p>
            <p className="muted">
              {plan.calibrated_from ? `Calibrated from ${plan.calibrated_from} measured requests.` : "From configured throughput (no measured requests yet)."}
            </p>
          </div>
          <div className="stats">
            <Stat label="KV per token" value={fmtBytes(plan.kv_bytes_per_token)} />
            <Stat label="KV per request" value={fmtBytes(plan.kv_bytes_per_request)} />
            <Stat label="Transfer lower bound" value={fmtMs(plan.transfer_lower_bound_ms)} hint={`expected ${fmtMs(plan.transfer_expected_ms)}`} />
          </div>
          <div className="card">
            <img className="plot" src={`data:image/png;base64,${plan.plot_png_base64}`} alt={`Planner plot: goodput per GPU by configuration; ${plan.recommended} recommended.`} />
          </div>
          <div className="card">
            <table className="table">
              <caption>Goodput per configuration</caption>
              <thead>
                <tr>
                  <th scope="col">Configuration</th>
                  <th scope="col">Goodput (req/s per GPU)</th>
                  <th scope="col">TTFT</th>
                  <th scope="col">TPOT</th>
                  <th scope="col">Bottleneck</th>
                  <th scope="col">GPUs per unit</th>
                </tr>
              </thead>
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
  tenant_id: string | null;
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
            {["tenant", "user", "api_key", "model", "tenant_model", "deployment", "slo_policy", "slo_assignment", "serve_config"].map((t) => (
              <option key={t} value={t}>
                {t}
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
            <thead>
              <tr>
                <th scope="col">When</th>
                <th scope="col">Who</th>
                <th scope="col">Action</th>
                <th scope="col">Target</th>
                <th scope="col">Change</th>
              </tr>
            </thead>
            <tbody>
              {log.data.data.map((a) => (
                <tr key={a.id}>
                  <td>{fmtTime(a.at)}</td>
                  <td>{a.actor}</td>
                  <th scope="row">{a.action}</th>
                  <td>
                    {a.target_type} <code className="small">{a.target_id?.slice(0, 8)}</code>
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
