/**
 * The image reference grammar of `schema/endpoint.schema.json` (`$defs/ImageReference`, Docker's
 * distribution/reference), for code that takes an image name without a schema in front of it:
 * the Docker client puts one in a request path only when it matches.
 */
import endpointSchema from '../../schema/endpoint.schema.json' with { type: 'json' };

const def = endpointSchema.$defs.ImageReference;
const IMAGE_REFERENCE = new RegExp(def.pattern, 'u');

/** True when `name` is an image reference the schema takes (e.g. `python:3.11`, `ghcr.io/o/r@sha256:…`). */
export function isImageReference(name: string): boolean {
  return name.length >= def.minLength && name.length <= def.maxLength && IMAGE_REFERENCE.test(name);
}
