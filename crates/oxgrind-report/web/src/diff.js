export function diffView() { throw new Error('not yet'); }
