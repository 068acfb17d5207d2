/**
 * A binary min-heap of items by a number given with each (kept beside the item, so comparisons
 * do not follow a pointer). A push in key order, the usual case (jobs of one TTL queued one
 * after another), stops at its first comparison.
 */
export class MinHeap<T> {
  #items: T[] = [];
  #keys: number[] = [];

  get size(): number {
    return this.#items.length;
  }

  /** The smallest key; Infinity when empty. */
  peekKey(): number {
    return this.#keys.length > 0 ? (this.#keys[0] as number) : Infinity;
  }

  peek(): T | undefined {
    return this.#items[0];
  }

  push(item: T, key: number): void {
    const items = this.#items;
    const keys = this.#keys;
    let i = items.length;
    items.push(item);
    keys.push(key);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const pk = keys[parent] as number;
      if (pk <= key) break;
      items[i] = items[parent] as T;
      keys[i] = pk;
      i = parent;
    }
    items[i] = item;
    keys[i] = key;
  }

  pop(): T | undefined {
    const items = this.#items;
    const keys = this.#keys;
    if (items.length === 0) return undefined;
    const top = items[0] as T;
    const item = items.pop() as T;
    const key = keys.pop() as number;
    if (items.length > 0) this.#siftDown(0, item, key);
    return top;
  }

  /** Replaces the contents with `items`, `keys[i]` the key of `items[i]` (bottom-up heapify, O(n)). */
  reset(items: T[], keys: number[]): void {
    this.#items = items;
    this.#keys = keys;
    for (let i = (items.length >> 1) - 1; i >= 0; i--) this.#siftDown(i, items[i] as T, this.#keys[i] as number);
  }

  /** Puts `item` with `key` at slot `i` or below, moving smaller children up. */
  #siftDown(i: number, item: T, key: number): void {
    const items = this.#items;
    const keys = this.#keys;
    const n = items.length;
    for (;;) {
      let child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && (keys[child + 1] as number) < (keys[child] as number)) child++;
      const ck = keys[child] as number;
      if (ck >= key) break;
      items[i] = items[child] as T;
      keys[i] = ck;
      i = child;
    }
    items[i] = item;
    keys[i] = key;
  }
}
