// A program using the API, for tsc --strict against index.d.ts (types.test.js): it must
// type-check, and each @ts-expect-error line must be an error (so the declarations are not any).
import * as retryd from 'retryd';

export async function main(): Promise<number> {
  const client = new retryd.Client({ socket: '/run/retryd/retryd.sock', fallbackToLocal: true });
  const orders: retryd.Dependency = client.dependency('orders');
  const state: retryd.BreakerState = orders.state;
  try {
    const permit = orders.admit(0);
    const probe: boolean = permit.probe;
    permit.complete(probe ? 'success' : 'ignored', 12.5);
    // @ts-expect-error: not an outcome
    permit.complete('fine');
  } catch (e) {
    if (e instanceof retryd.RejectedError) {
      const reason: retryd.RejectionReason = e.reason;
      void reason;
    }
  }
  const n: number = await orders.call(
    async (a: retryd.Attempt) => a.number + (a.timeoutMs ?? 0),
    {
      maxAttempts: 3,
      jitter: 'full',
      deadlineMs: 2000,
      attemptTimeoutMs: 800,
      observer: (i: retryd.AttemptInfo) => {
        const w: number = i.waitMs;
        void w;
      },
      classifyError: (e: unknown) => (e instanceof Error ? 'other' : null),
    },
    { signal: new AbortController().signal },
  );
  // @ts-expect-error: not a policy key
  await orders.call(() => 1, { retries: 3 });
  const get = retryd.adapters.fetch(orders, { deadlineMs: 2000 });
  const response: Response = await get('http://orders.internal/v1/orders/42');
  const result = new retryd.AttemptResult({ status: 503, retryAfter: '1' });
  const classifier = new retryd.Classifier().setStatus(404, 'retryable', 'failure');
  void state;
  void response;
  void result;
  void classifier;
  client.close();
  return n;
}
