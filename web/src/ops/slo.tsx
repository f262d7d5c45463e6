// The operator's SLO policies page (/ops/slo): latency targets, their queue bounds, and to whom they apply.
import { useState, type FormEvent } from "react";
import { api } from "../api";
import { Empty, ErrorMessage, InputField, Page, RowButton, SelectField, Table, useAction, useApi, useForm } from "../components";
import type { Assignment, Model, Policy, Tenant } from "./types";

export function SloPolicies() {
  const data = useApi<{ policies: Policy[]; assignments: Assignment[] }>("/ops/slo-policies");
  const tenants = useApi<Tenant[]>("/ops/tenants");
  const models = useApi<Model[]>("/ops/models");
  const act = useAction(() => data.reload());
  const pol = useForm({ name: "", ttft_ms: 500, tpot_ms: 50, percentile: 99, priority: 0, weight: 1, sheddable: false, max_wait_s: "", max_waiting: "" });
  const asg = useForm({ policy_id: "", tenant_id: "", model_id: "" });
  const [weight, setWeight] = useState<{ id: string; value: string } | null>(null);
  const create = (e: FormEvent) => {
    e.preventDefault();
    const { form } = pol;
    const body = { ...form, max_wait_s: form.max_wait_s === "" ? null : Number(form.max_wait_s), max_waiting: form.max_waiting === "" ? null : Number(form.max_waiting) };
    act.run(() => api("/ops/slo-policies", { method: "POST", body }));
  };
  const saveWeight = async (e: FormEvent) => {
    e.preventDefault();
    if (weight && (await act.run(() => api(`/ops/slo-policies/${weight.id}`, { method: "PATCH", body: { weight: Number(weight.value) } })))) setWeight(null);
  };
  const assign = (e: FormEvent) => {
    e.preventDefault();
    const { policy_id, tenant_id, model_id } = asg.form;
    act.run(() => api("/ops/slo-assignments", { method: "POST", body: { policy_id, tenant_id: tenant_id || null, model_id: model_id || null } }));
  };
  const policyName = (id: string) => data.data?.policies.find((p) => p.id === id)?.name ?? id;
  const tenantName = (id: string | null) => (id ? tenants.data?.find((t) => t.id === id)?.name ?? id : "any tenant");
  const modelName = (id: string | null) => (id ? models.data?.find((m) => m.id === id)?.name ?? id : "any model");
  return (
    <Page title="SLO policies" intro="Latency targets, and to whom they apply. They drive admission and each pool's autoscaling.">
      <div className="two-col">
        <form className="card form" onSubmit={create} aria-labelledby="pol-title">
          <h2 id="pol-title">New policy</h2>
          <InputField bare id="pol-name" label="Name" required maxLength={100} {...pol.text("name")} />
          <div className="row">
            <InputField id="pol-ttft" label="TTFT target (ms)" type="number" min={1} required {...pol.num("ttft_ms")} />
            <InputField id="pol-tpot" label="TPOT target (ms)" type="number" min={1} required {...pol.num("tpot_ms")} />
          </div>
          <div className="row">
            <InputField id="pol-pct" label="Percentile" type="number" min={1} max={100} step="0.1" {...pol.num("percentile")} />
            <InputField id="pol-prio" label="Priority (0–100)" type="number" min={0} max={100} {...pol.num("priority")} />
            <InputField id="pol-weight" label="Weight" type="number" min={0.01} max={100} step="any" required aria-describedby="pol-weight-hint" {...pol.num("weight")} />
          </div>
          <p id="pol-weight-hint" className="hint">Weight: share of the band's tokens relative to other tenants (1 = equal).</p>
          <div className="row">
            <InputField id="pol-maxwait" label="Longest wait in the queue (s)" type="number" min={0.001} max={3600} step="any" placeholder="gateway's" aria-describedby="pol-queue-hint" {...pol.text("max_wait_s")} />
            <InputField id="pol-maxwaiting" label="Waiting per tenant" type="number" min={1} max={100000} step={1} placeholder="no bound" aria-describedby="pol-queue-hint" {...pol.text("max_waiting")} />
          </div>
          <p id="pol-queue-hint" className="hint">Under overload: how long a request may wait for room, and how many of one tenant's requests may wait at once (per gateway process); past either, 429 with Retry-After. Empty: the gateway's settings.</p>
          <label className="inline">
            <input type="checkbox" {...pol.check("sheddable")} /> Sheddable under overload
          </label>
          <button type="submit" disabled={act.busy}>
            Create policy
          </button>
        </form>
        <form className="card form" onSubmit={assign} aria-labelledby="asg-title">
          <h2 id="asg-title">Assign a policy</h2>
          <SelectField bare id="asg-policy" label="Policy" required placeholder="Choose a policy" options={data.data?.policies} {...asg.text("policy_id")} />
          <SelectField bare id="asg-tenant" label="Tenant" placeholder="any tenant" options={tenants.data} {...asg.text("tenant_id")} />
          <SelectField bare id="asg-model" label="Model" placeholder="any model" options={models.data} {...asg.text("model_id")} />
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
              <Table cols={["Name", "TTFT", "TPOT", "Percentile", "Priority", "Weight", "Queue", "Sheddable", "Applies to"]} actions="Actions">
                {data.data.policies.map((p) => {
                  const applies = data.data!.assignments.filter((a) => a.policy_id === p.id);
                  return (
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
                            <RowButton type="submit" label="Save" target={`weight of ${p.name}`} disabled={act.busy} />
                            <button type="button" className="secondary" onClick={() => setWeight(null)}>
                              Cancel
                            </button>
                          </form>
                        ) : (
                          <>
                            {p.weight}{" "}
                            <RowButton label="Edit" target={`weight of ${p.name}`} className="link" disabled={act.busy} onClick={() => setWeight({ id: p.id, value: String(p.weight) })} />
                          </>
                        )}
                      </td>
                      <td>
                        {p.max_wait_s === null ? "gateway's wait" : `waits ≤ ${p.max_wait_s} s`}
                        {p.max_waiting === null ? "" : `, ≤ ${p.max_waiting} waiting`}
                      </td>
                      <td>{p.sheddable ? "yes" : "no"}</td>
                      <td>
                        {applies.length === 0 && <span className="muted">not assigned</span>}
                        <ul className="plain">
                          {applies.map((a) => {
                            const to = `${tenantName(a.tenant_id)} / ${modelName(a.model_id)}`;
                            return (
                              <li key={a.id}>
                                {to}{" "}
                                <RowButton label="Unassign" target={`${p.name} from ${to}`} className="link danger" disabled={act.busy}
                                  onClick={() => act.confirmed(`Stop applying “${p.name}” to ${to}? A less specific assignment applies instead, if any.`, () => api(`/ops/slo-assignments/${a.id}`, { method: "DELETE" }))} />
                              </li>
                            );
                          })}
                        </ul>
                      </td>
                      <td className="actions">
                        <RowButton label="Delete" target={p.name} className="danger" disabled={act.busy}
                          onClick={() => act.confirmed(`Delete the policy “${p.name}”? Its assignments go with it; deployments that used it keep running without one.`, () => api(`/ops/slo-policies/${p.id}`, { method: "DELETE" }))} />
                      </td>
                    </tr>
                  );
                })}
              </Table>
            </div>
          )}
          <span className="sr-only">{data.data.assignments.map((a) => policyName(a.policy_id)).join(", ")}</span>
        </div>
      )}
    </Page>
  );
}
