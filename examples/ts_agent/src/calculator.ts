/**
 * The `calculate` tool: exact arithmetic over numbers, `+ - * / **`, unary minus and parentheses, by a small
 * recursive-descent parser (never `eval`). Also the reward's number matching.
 */

/** The tool as the model sees it (OpenAI function-tool schema). */
export const CALCULATE_TOOL = {
  type: "function",
  function: {
    name: "calculate",
    description: "Evaluate an arithmetic expression with numbers, + - * / ** and parentheses.",
    parameters: {
      type: "object",
      properties: {
        // The pattern keeps a constrained tool call to arithmetic (the gateway compiles the schema into the grammar
        // of a forced call): a small model otherwise writes prose inside the string until its token budget ends.
        expression: { type: "string", description: "for example (12 + 3) * 4", pattern: "^[-+*/(). 0-9]{1,24}$" },
      },
      required: ["expression"],
      additionalProperties: false,
    },
  },
} as const;

const TOKEN = /\s*(\d+(?:\.\d+)?|\*\*|[-+*/()])/y;

/**
 * The value of `expression`.
 *
 * @throws Error naming what is wrong (an unexpected character, unbalanced parentheses, division by zero).
 */
export function calculate(expression: string): number {
  const tokens: string[] = [];
  TOKEN.lastIndex = 0;
  const text = expression.replace(/,/g, "").trim();
  while (TOKEN.lastIndex < text.length) {
    const at = TOKEN.lastIndex;
    const match = TOKEN.exec(text);
    if (match === null || match[1] === undefined) {
      throw new Error(`unexpected character ${JSON.stringify(text.slice(at).trim()[0] ?? "")} at ${at}`);
    }
    tokens.push(match[1]);
  }
  let position = 0;
  const peek = (): string | undefined => tokens[position];
  const take = (): string | undefined => tokens[position++];

  // sum := product (('+' | '-') product)*; product := power (('*' | '/') power)*;
  // power := unary ('**' power)?; unary := '-' unary | '+' unary | atom; atom := number | '(' sum ')'
  const sum = (): number => {
    let value = product();
    while (peek() === "+" || peek() === "-") value = take() === "+" ? value + product() : value - product();
    return value;
  };
  const product = (): number => {
    let value = power();
    while (peek() === "*" || peek() === "/") {
      if (take() === "*") {
        value *= power();
      } else {
        const divisor = power();
        if (divisor === 0) throw new Error("division by zero");
        value /= divisor;
      }
    }
    return value;
  };
  const power = (): number => {
    const base = unary();
    return peek() === "**" ? (take(), base ** power()) : base;
  };
  const unary = (): number => {
    if (peek() === "-") return (take(), -unary());
    if (peek() === "+") return (take(), unary());
    return atom();
  };
  const atom = (): number => {
    const token = take();
    if (token === "(") {
      const value = sum();
      if (take() !== ")") throw new Error("missing )");
      return value;
    }
    if (token === undefined || !/^\d/.test(token)) throw new Error(`expected a number, got ${token ?? "the end"}`);
    return Number(token);
  };

  if (tokens.length === 0) throw new Error("empty expression");
  const value = sum();
  if (position !== tokens.length) throw new Error(`unexpected ${tokens[position]}`);
  if (!Number.isFinite(value)) throw new Error("the result is not a finite number");
  return value;
}

/** A value as the tool returns it: integers exactly, others rounded to 6 decimals. */
export function formatNumber(value: number): string {
  return Number.isInteger(value) ? String(value) : String(Number(value.toFixed(6)));
}

/**
 * Whether `text` contains a number equal to `gold` (thousands commas ignored; relative tolerance 1e-6). A minus
 * sign right after a digit is an operator, not a sign: `12-5` holds 12 and 5.
 */
export function containsNumber(text: string, gold: number): boolean {
  for (const match of text.replace(/(\d),(\d{3})/g, "$1$2").matchAll(/(?<![\d.])-?\d+(?:\.\d+)?/g)) {
    if (Math.abs(Number(match[0]) - gold) <= 1e-6 * Math.max(1, Math.abs(gold))) return true;
  }
  return false;
}
