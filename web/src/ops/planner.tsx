// The operator's planner (/ops/planner): whether a model should be disaggregated, and at which prefill:decode
// ratio, from the goodput per GPU of each configuration under an SLO.
import { useState, type FormEvent } from "react";
import { api } from "../api";
import { ErrorMessage, InputField, Page, SelectField, Stat, Table, fmtBytes, fmtMs, useAction, useApi, useFirstChoice, useForm } from "../components";
import type { Model } from "./types";

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
  const [modelId, setModelId] = useFirstChoice(models.data);
  const f = useForm({ ttft_ms: 1000, tpot_ms: 50, percentile: 90, prompt_tokens_mean: 512, output_tokens_mean: 128 });
  const form = f.form;
  const [plan, setPlan] = useState<PlanResult | null>(null);
  const act = useAction(() => {});
  const run = (e: FormEvent) => {
    e.preventDefault();
    act.run(async () => setPlan(await api<PlanResult>(`/ops/models/${modelId}/plan`, { method: "POST", body: form })));
  };
  const field = (id: keyof typeof form, label: string) => (
    <InputField id={`plan-${id}`} label={label} type="number" min={id.endsWith("_ms") ? 0.1 : 1} step={id.endsWith("_ms") || id === "percentile" ? "any" : 1} required {...f.num(id)} />
  );
  return (
    <Page title="P/D planner" intro="Should a model be disaggregated, and at which prefill:decode ratio? Goodput per GPU decides.">
      <form className="card form" onSubmit={run}>
        <div className="grid-3">
          <SelectField id="plan-model" label="Model" options={models.data} value={modelId} onChange={(e) => setModelId(e.target.value)} required />
          {field("ttft_ms", "TTFT SLO (ms)")}
          {field("tpot_ms", "TPOT SLO (ms)")}
          {field("percentile", "Percentile")}
          {field("prompt_tokens_mean", "Mean prompt tokens")}
          {field("output_tokens_mean", "Mean output tokens")}
        </div>
        <ErrorMessage error={act.error} title="The planner could not run" />
        <button type="submit" disabled={act.busy || !modelId}>
          {act.busy ? "Planning…" : "Plan"}
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
            <Table caption="Goodput per configuration" showCaption cols={["Configuration", "Goodput (req/s per GPU)", "TTFT", "TPOT", "Bottleneck", "GPUs per unit"]}>
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
            </Table>
          </div>
        </>
      )}
    </Page>
  );
}
