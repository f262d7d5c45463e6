// Streams an OpenAI chat completion through the gateway with fetch + ReadableStream and parses the
// server-sent events by hand (EventSource cannot POST or send an Authorization header).

export interface StreamEvents {
  onDelta: (text: string) => void;
  onUsage?: (usage: { prompt_tokens: number; completion_tokens: number }) => void;
}

export interface StreamResult {
  finishReason: string | null;
  ttftMs: number | null;
  totalMs: number;
  chunks: number;
}

export class StreamError extends Error {}

/** Splits an SSE byte stream into events ({event, data}); tolerant of \r\n and chunk boundaries. */
export async function* sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<{ event: string; data: string }> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const i = line.indexOf(":");
        const field = i < 0 ? line : line.slice(0, i);
        const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
        if (field === "event") event = val;
        else if (field === "data") data.push(val);
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

export async function streamChat(
  key: string,
  body: Record<string, unknown>,
  events: StreamEvents,
  signal?: AbortSignal,
): Promise<StreamResult> {
  const started = performance.now();
  let res: Response;
  try {
    res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      signal,
      credentials: "omit",
    });
  } catch (e) {
    if ((e as Error).name === "AbortError") throw e;
    throw new StreamError("The gateway could not be reached.");
  }
  if (!res.ok || !res.body) {
    let message = `The gateway answered ${res.status}.`;
    try {
      const j = await res.json();
      if (j?.error?.message) message = `${j.error.message} (HTTP ${res.status})`;
    } catch {
      /* keep the status */
    }
    throw new StreamError(message);
  }
  let ttft: number | null = null;
  let finish: string | null = null;
  let chunks = 0;
  for await (const ev of sseEvents(res.body)) {
    if (ev.data === "[DONE]") break;
    let obj: any;
    try {
      obj = JSON.parse(ev.data);
    } catch {
      throw new StreamError("The gateway sent an event that is not JSON.");
    }
    if (ev.event === "error" || obj?.error) {
      throw new StreamError(obj?.error?.message ?? "The stream ended with an error.");
    }
    const choice = obj?.choices?.[0];
    const text: string | undefined = choice?.delta?.content ?? choice?.text;
    if (text) {
      if (ttft === null) ttft = performance.now() - started;
      chunks += 1;
      events.onDelta(text);
    }
    if (choice?.finish_reason) finish = choice.finish_reason;
    if (obj?.usage && events.onUsage) events.onUsage(obj.usage);
  }
  return { finishReason: finish, ttftMs: ttft, totalMs: performance.now() - started, chunks };
}
