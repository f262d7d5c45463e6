// The operator's Deployments page (/ops/deployments): what each model should run, and what Ray Serve reports.
import { useState, type FormEvent } from "react";
import { ApiError, api } from "../api";
import { Badge, ErrorMessage, Field, LoadedTable, Page, RowButton, SelectField, stateTone, useAction, useApi, useFirstChoice } from "../components";
import type { Deployment, Model, Policy } from "./types";

type Pool = { min: number; max: number };

const MODES = [
  ["aggregated", "Aggregated"],
  ["pd", "Prefill/decode split"],
] as const;

/** A pool's replicas, least and most (ids ``${id}min`` and ``${id}max``). */
function Replicas({ title, id, pool, onChange }: { title: string; id: string; pool: Pool; onChange: (pool: Pool) => void }) {
  const num = (v: string) => Math.max(0, Number(v) || 0);
  return (
    <div>
      <span className="label">{title}</span>
      <div className="row">
        <label htmlFor={`${id}min`}>min</label>
        <input id={`${id}min`} type="number" min={0} value={pool.min} onChange={(e) => onChange({ ...pool, min: num(e.target.value) })} />
        <label htmlFor={`${id}max`}>max</label>
        <input id={`${id}max`} type="number" min={1} value={pool.max} onChange={(e) => onChange({ ...pool, max: num(e.target.value) })} />
      </div>
    </div>
  );
}

export function Deployments() {
  const deps = useApi<Deployment[]>("/ops/deployments", [], 2000);
  const models = useApi<Model[]>("/ops/models");
  const policies = useApi<{ policies: Policy[] }>("/ops/slo-policies");
  const act = useAction(() => deps.reload());
  const [name, setName] = useState("");
  const [modelId, setModelId] = useFirstChoice(models.data);
  const [mode, setMode] = useState<"aggregated" | "pd">("aggregated");
  const [prefill, setPrefill] = useState({ min: 1, max: 1 });
  const [decode, setDecode] = useState({ min: 1, max: 1 });
  const [policyId, setPolicyId] = useState("");

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

  return (
    <Page title="Deployments" intro="What each model should run, and what Ray Serve reports (refreshed every 2 seconds).">
      <form className="card form" onSubmit={create} aria-labelledby="dep-create-title">
        <h2 id="dep-create-title">New deployment</h2>
        <div className="grid-3">
          <Field id="dep-name" label="Name">
            <input id="dep-name" required pattern="[a-z0-9][a-z0-9\-]{0,62}" value={name} onChange={(e) => setName(e.target.value)} aria-describedby="dep-name-hint" />
            <p id="dep-name-hint" className="hint">
              Lower-case letters, digits and “-”; also the route on Ray Serve.
            </p>
          </Field>
          <SelectField id="dep-model" label="Model" required options={models.data} value={modelId} onChange={(e) => setModelId(e.target.value)} />
          <fieldset>
            <legend>Mode</legend>
            {MODES.map(([m, label]) => (
              <label key={m} className="inline">
                <input type="radio" name="dep-mode" checked={mode === m} onChange={() => setMode(m)} /> {label}
              </label>
            ))}
          </fieldset>
          {mode === "pd" && <Replicas title="Prefill replicas" id="dep-p" pool={prefill} onChange={setPrefill} />}
          <Replicas title={mode === "pd" ? "Decode replicas" : "Replicas"} id="dep-d" pool={decode} onChange={setDecode} />
          <SelectField id="dep-policy" label="SLO policy" placeholder="none" options={policies.data?.policies} value={policyId} onChange={(e) => setPolicyId(e.target.value)} />
        </div>
        <ErrorMessage error={act.error} />
        <button type="submit" disabled={act.busy || !modelId}>
          Create deployment
        </button>
      </form>
      <LoadedTable q={deps} what="deployments" empty="No deployments yet." aria-live="polite" caption="Deployments" cols={["Name", "Model", "Mode and pools", "Desired", "Observed", "Generation"]} actions="Actions">
        {(d) => (
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
              {d.desired_state === "running" && <RowButton label="Stop" target={d.name} className="secondary" onClick={() => setDesired(d, "stopped")} />}
              {d.desired_state === "stopped" && <RowButton label="Start" target={d.name} className="secondary" onClick={() => setDesired(d, "running")} />}
              {d.desired_state !== "deleted" && <RowButton label="Delete" target={d.name} className="danger" onClick={() => remove(d)} />}
            </td>
          </tr>
        )}
      </LoadedTable>
    </Page>
  );
}
