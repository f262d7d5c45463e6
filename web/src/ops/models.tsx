// The operator's Models page (/ops/models): the catalogue, each model's weights and shape.
import type { FormEvent } from "react";
import { api } from "../api";
import { ErrorMessage, InputField, LoadedTable, Page, RowButton, SelectField, fmtInt, useAction, useApi, useForm } from "../components";
import type { Model } from "./types";

const DTYPES = ["float32", "float16", "bfloat16", "fp8", "int8"].map((d) => ({ id: d, name: d }));
const KINDS = [
  { id: "generate", name: "chat and completions" },
  { id: "embed", name: "embeddings" },
];
/** The shape's fields, each a whole number of at least 1. */
const SHAPE = [
  ["context_length", "Context (tokens)"],
  ["num_layers", "Layers"],
  ["num_kv_heads", "KV heads"],
  ["head_dim", "Head dimension"],
] as const;
const BLANK = { name: "", source: "", context_length: 2048, num_layers: 2, num_kv_heads: 2, head_dim: 32, dtype: "float32", params_b: "",
  kind: "generate", tool_call_parser: "", reasoning_parser: "", chat_template: "" };

export function ModelsCatalogue() {
  const models = useApi<Model[]>("/ops/models");
  const act = useAction(() => models.reload());
  const f = useForm(BLANK);
  const { form } = f;
  const create = async (e: FormEvent) => {
    e.preventDefault();
    const body = { ...form, params_b: form.params_b === "" ? null : Number(form.params_b),
      tool_call_parser: form.tool_call_parser || null, reasoning_parser: form.reasoning_parser || null,
      chat_template: form.chat_template || null };
    if (await act.run(() => api("/ops/models", { method: "POST", body }))) f.setForm(BLANK);
  };
  return (
    <Page title="Models" intro="The catalogue: each model's weights and the shape the planner and the KV-size formula use.">
      <form className="card form" onSubmit={create} aria-labelledby="model-title">
        <h2 id="model-title">Add a model</h2>
        <div className="grid-3">
          <InputField id="model-name" label="Name" required maxLength={200} pattern="[A-Za-z0-9][A-Za-z0-9._:/\-]*" {...f.text("name")} />
          <InputField id="model-source" label="Weights (folder on the workers)" required maxLength={4096} {...f.text("source")} />
          <SelectField id="model-dtype" label="Data type" options={DTYPES} {...f.text("dtype")} />
          {SHAPE.map(([k, label]) => (
            <InputField key={k} id={`model-${k}`} label={label} type="number" min={1} required {...f.num(k)} />
          ))}
          <InputField id="model-params" label="Parameters (billions, optional)" type="number" min={0} step="any" {...f.text("params_b")} />
          <SelectField id="model-kind" label="Serves" options={KINDS} {...f.text("kind")} />
          {form.kind === "generate" && (
            <>
              <InputField id="model-tools" label="Tool-call parser (optional, e.g. hermes)" maxLength={64} pattern="[a-z0-9_]*" {...f.text("tool_call_parser")} />
              <InputField id="model-reasoning" label="Reasoning parser (optional)" maxLength={64} pattern="[a-z0-9_]*" {...f.text("reasoning_parser")} />
            </>
          )}
          <div className="span-all">
            <label htmlFor="model-template">Chat template (optional; Jinja, replaces the model's own)</label>
            <textarea id="model-template" rows={3} maxLength={65536} {...f.text("chat_template")} />
          </div>
          <div className="align-end">
            <button type="submit" disabled={act.busy}>
              Add model
            </button>
          </div>
        </div>
        <ErrorMessage error={act.error} />
      </form>
      <LoadedTable q={models} what="models" empty="No models yet." caption="Models" cols={["Model", "Weights", "Context", "Shape", "Serves"]} actions="Actions">
        {(m) => (
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
              <RowButton label="Delete" target={m.name} className="danger" disabled={act.busy}
                onClick={() => act.confirmed(`Delete the model “${m.name}”? Every tenant loses access to it; a model that deployments still use cannot be deleted.`, () => api(`/ops/models/${m.id}`, { method: "DELETE" }))} />
            </td>
          </tr>
        )}
      </LoadedTable>
    </Page>
  );
}
