export function dhatView() { throw new Error('not yet'); }
