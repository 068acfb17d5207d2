/** A FIFO with O(1) push and shift (an array with a moving head, compacted now and then). */
export class Deque<T> {
  #items: T[] = [];
  #head = 0;

  get size(): number {
    return this.#items.length - this.#head;
  }

  push(item: T): void {
    this.#items.push(item);
  }

  shift(): T | undefined {
    if (this.#head >= this.#items.length) return undefined;
    const item = this.#items[this.#head] as T;
    this.#dropHead();
    return item;
  }

  #dropHead(): void {
    (this.#items as (T | undefined)[])[this.#head] = undefined;
    this.#head++;
    if (this.#head > 1024 && this.#head * 2 > this.#items.length) {
      this.#items = this.#items.slice(this.#head);
      this.#head = 0;
    }
  }

  /**
   * Removes and returns the first item `pick` accepts, front to back. The items it skipped
   * move one slot back (toward the tail) instead of the tail moving forward, so a take costs
   * the number of items skipped, not the deque's length: a fenced job at the head of a
   * million-job backlog costs one move per take.
   */
  take(pick: (item: T) => boolean): T | undefined {
    const items = this.#items;
    const head = this.#head;
    for (let i = head; i < items.length; i++) {
      const item = items[i] as T;
      if (!pick(item)) continue;
      for (let k = i; k > head; k--) items[k] = items[k - 1] as T;
      this.#dropHead();
      return item;
    }
    return undefined;
  }

  peek(): T | undefined {
    return this.#head < this.#items.length ? this.#items[this.#head] : undefined;
  }

  /** Calls `fn` on every item, front to back (a plain loop: the TTL heap's rebuild walks long backlogs with it). */
  forEach(fn: (item: T) => void): void {
    const items = this.#items;
    for (let i = this.#head; i < items.length; i++) fn(items[i] as T);
  }

  *[Symbol.iterator](): IterableIterator<T> {
    for (let i = this.#head; i < this.#items.length; i++) yield this.#items[i] as T;
  }

  /** Keeps only the items `keep` accepts, in order (one pass, O(size)). */
  retain(keep: (item: T) => boolean): void {
    const kept: T[] = [];
    for (let i = this.#head; i < this.#items.length; i++) {
      const item = this.#items[i] as T;
      if (keep(item)) kept.push(item);
    }
    this.#items = kept;
    this.#head = 0;
  }

  clear(): void {
    this.#items = [];
    this.#head = 0;
  }
}
